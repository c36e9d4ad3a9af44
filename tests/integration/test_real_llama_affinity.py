"""Prompt-cache affinity on two real `llama-server`s (b11434) serving the same model: a
conversation's next turn goes back to the server that ran its last one, whose prompt cache
still holds it, as that server's own `timings` show; and, on two routers started with
`--slot-save-path`, a turn whose model has left both is loaded back where its cache was
saved."""

import pytest
from django.core.management import call_command

from access.models import ApiKey
from backends.models import Deployment, Server
from scheduler.models import Request
from tests.integration.conftest import eventually
from tests.integration.test_real_llama_prompt_cache import start_router
from tests.integration.test_real_llama_router import assert_words

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful assistant who answers in a few words. " * 3
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]


def turn(live, messages: list, model: str = "tiny-5mb") -> tuple[dict, Request]:
    answer = live.post(
        "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 4}
    )
    assert answer.status_code == 200, (answer.text, live.log())
    body = answer.json()
    assert_words(body["choices"][0]["message"]["content"])
    return body, Request.objects.select_related("server").latest("created_at")


def operate(live, server: str, action: str, **body) -> None:
    """An operator's drain, enable or unload, through the operator API."""
    key, secret = ApiKey.generate(f"ops-{action}", operator=True)
    key.save()
    done = live.http.post(
        f"/api/v1/servers/{server}/{action}",
        json=body or None,
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert done.status_code == 202, done.text
    if action in ("drain", "enable"):
        enabled = action == "enable"
        eventually(lambda: Server.objects.get(name=server).enabled == enabled, what=action)


def test_a_conversation_goes_back_to_the_server_holding_its_prompt_cache(single, switchyard):
    """The first turn runs on b while a is drained. With a back, the second turn is routed
    to b for its conversation (its trace says so), and b answers most of its prompt from
    its cache: `cache_n` covers the first turn's prompt. Breaks with affinity off: the
    second turn names no last server (seen with SWITCHYARD_CACHE_AFFINITY_S=0)."""
    for name in ("a", "b"):
        llama = single("tiny-5mb", ctx=2048)
        Server.objects.create(name=name, kind="openai", base_url=llama.url, health="up")
        call_command("sync_models", name)
    live = switchyard()

    operate(live, "a", "drain")
    first, first_row = turn(live, FIRST)
    assert first_row.server.name == "b"
    assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] > 60
    operate(live, "a", "enable")

    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    second, second_row = turn(live, [*FIRST, reply, {"role": "user", "content": "Another."}])
    assert second_row.server.name == "b"
    assert second_row.cache_server_id == first_row.server_id
    assert "where its conversation's last turn ran" in second_row.traces.first().reason
    assert second["timings"]["cache_n"] >= first["timings"]["prompt_n"] - 2

    # A new conversation names no server: load alone decides.
    _, other = turn(live, [{"role": "user", "content": "Count to three."}])
    assert other.cache_server_id is None and other.affinity_key


def test_a_turn_whose_model_left_every_server_is_loaded_back_where_its_cache_was_saved(
    llama_server_binary, tiny_models, tmp_path, switchyard
):
    """Two routers that save a model's slots as it unloads. The first turn runs on b (a
    drained); the operator then unloads `tiny` from b, so both servers are empty alike. The
    second turn's load goes to b, not to a (which sorts first), and b's router restores the
    saved slots: the prompt comes from the cache. Breaks if the tie went to the id."""
    routers = []
    try:
        for name in ("a", "b"):
            workdir = tmp_path / name
            (workdir / "slots").mkdir(parents=True)
            routers.append(
                start_router(tiny_models, workdir, **{"slot-save-path": f"{workdir}/slots/"})
            )
            Server.objects.create(
                name=name, kind="llamacpp", base_url=routers[-1].url, health="up", max_llm=1
            )
            call_command("sync_models", name)
        live = switchyard()
        operate(live, "a", "drain")
        first, first_row = turn(live, FIRST, model="tiny")
        assert first_row.server.name == "b"
        assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] > 60
        operate(live, "a", "enable")
        operate(live, "b", "unload", model="tiny")
        tiny = Deployment.objects.filter(model__name="tiny")
        eventually(
            lambda: set(tiny.values_list("state", flat=True)) == {"unloaded"},
            what="tiny unloaded everywhere (not still unloading on b)",
        )

        reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
        second, second_row = turn(
            live, [*FIRST, reply, {"role": "user", "content": "Another."}], model="tiny"
        )
    finally:
        for router in routers:
            router.stop()
    assert second_row.server.name == "b"
    assert second["timings"]["cache_n"] >= first["timings"]["prompt_n"] - 2

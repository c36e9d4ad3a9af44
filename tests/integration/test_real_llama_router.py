"""Switchyard's `llamacpp` kind in front of the real llama.cpp router (`llama-server
--models-preset … --models-max 1`, build b11434): discovery, loads and unloads by the
scheduler, every kind of call, failures the real router really has."""

import contextlib
import json
import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from backends.adapters.base import LoadTarget
from backends.adapters.llamacpp import LlamaCppAdapter
from backends.models import Deployment, DeploymentState, Model, ModelType, Server
from dashboard.state import overview
from scheduler.models import Request, State
from tests.integration.conftest import WAIT_S, eventually
from tests.support import real_llama

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")
from tests.support import tiny_gguf  # noqa: E402 (needs gguf)

pytestmark = pytest.mark.integration

DS = DeploymentState
CHAT = [{"role": "user", "content": "Say something."}]
# The tiny models only ever generate whole words from their vocabulary (see tiny_gguf).
WORDS = {piece.removeprefix("\u2581") for piece in tiny_gguf.word_pieces(tiny_gguf.SMALL.words)}


def discovered(router, **capacity) -> Server:
    """A `llamacpp` server row for the router, its models found by `manage.py sync_models`."""
    server = Server.objects.create(
        name="router", kind="llamacpp", base_url=router.url, slots=2, health="up", **capacity
    )
    call_command("sync_models", "router")
    return server


def chat(switchyard, model: str, **extra) -> dict:
    answer = switchyard.post(
        "/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 8, **extra}
    )
    assert answer.status_code == 200, (answer.text, switchyard.log())
    return answer.json()


def events(lines) -> list:
    """The JSON of each `data:` event, and "[DONE]"."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def streamed(switchyard, path: str, body: dict) -> list:
    with switchyard.stream(path, body) as response:
        assert response.status_code == 200, response.read()
        return events(response.iter_lines())


def text_of(chunks: list) -> str:
    parts = []
    for chunk in chunks:
        for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
            parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(parts)


def assert_words(text: str) -> None:
    assert text.split() and set(text.split()) <= WORDS, text


def states(server: Server) -> dict[str, str]:
    return dict(server.deployments.values_list("server_model_id", "state"))


def router_states(router) -> dict[str, str]:
    return {e["id"]: e["status"]["value"] for e in router.api("GET", "/models").json()["data"]}


def matches_router(server: Server, router) -> bool:
    """Switchyard's deployments say what the router says (loaded or not)."""
    ours = {k: v == DS.LOADED for k, v in states(server).items()}
    theirs = {k: v == "loaded" for k, v in router_states(router).items()}
    return ours == theirs


@pytest.mark.django_db
def test_discovery_finds_every_preset_with_its_type(router):
    server = discovered(router)
    assert states(server) == dict.fromkeys(["broken", "embed", "large", "tiny"], DS.UNLOADED)
    types = dict(Model.objects.values_list("name", "type"))
    assert types == {
        "broken": ModelType.LLM,
        "embed": ModelType.EMBEDDING,
        "large": ModelType.LLM,
        "tiny": ModelType.LLM,
    }


def test_alternating_models_swap_through_the_scheduler(router, switchyard):
    server = discovered(router, max_llm=1)
    live = switchyard()
    assert_words(chat(live, "tiny")["choices"][0]["message"]["content"])
    assert router_states(router)["tiny"] == "loaded"

    chunks = streamed(
        live,
        "/v1/chat/completions",
        {
            "model": "large",
            "messages": CHAT,
            "max_tokens": 8,
            "stream_options": {"include_usage": True},
        },
    )
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] == 8
    assert_words(text_of(chunks))
    assert router_states(router)["large"] == "loaded"
    assert router_states(router)["tiny"] == "unloaded"

    chunks = streamed(live, "/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 8})
    assert chunks[-1] == "[DONE]"
    assert_words(text_of(chunks))
    # Not asked for, the usage is not sent, but it is counted (quotas, the usage report).
    assert all(chunk["choices"] for chunk in chunks[:-1])
    unasked = Request.objects.get(kind="completion", stream=True)
    assert unasked.result["usage"]["completion_tokens"] == 8
    answer = live.post("/v1/completions", {"model": "large", "prompt": "Once", "max_tokens": 8})
    assert answer.status_code == 200, answer.text
    assert_words(answer.json()["choices"][0]["text"])

    eventually(lambda: matches_router(server, router), what="deployments match the router")
    # Discovery found no slots (no model ran then); each model's first load learnt them from
    # its own /props, the preset's `np` (2), before its first request was sent. A model
    # never loaded has none to give.
    slots = dict(server.deployments.values_list("model__name", "slots"))
    assert (slots["large"], slots["tiny"], slots["embed"]) == (2, 2, None)
    # Its /props says too that its template takes no tools and it has no projector: the
    # model takes text only, and the context its slots run with.
    said = {m.name: (m.capabilities, m.context_length) for m in Model.objects.all()}
    assert said["large"][0] == [] and said["large"][1] > 0
    assert said["tiny"][0] == [] and said["tiny"][1] > 0
    assert said["embed"] == (None, None)
    requests = list(Request.objects.order_by("created_at"))
    assert [r.state for r in requests] == [State.COMPLETED] * 4
    assert [r.attempts for r in requests] == [1] * 4  # none sent on a connection gone dead
    # Each swap was the scheduler's: it unloaded the other model before loading.
    assert "unloaded" not in json.dumps([r.error for r in requests])


def test_a_model_is_sent_no_more_at_once_than_it_serves(router, switchyard):
    """The server takes 4 at once, the router's model runs 2 slots (the preset's `np`), and
    nobody said so: its load learns it before the first requests go, so the other two wait
    in Switchyard's line (where a better class can pass them), not in llama-server's."""
    server = discovered(router, max_llm=1)
    Server.objects.filter(pk=server.pk).update(slots=4)
    live = switchyard()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: chat(live, "large", max_tokens=64), range(4)))
    requests = list(Request.objects.all())
    first_end = min(r.finished_at for r in requests)
    assert sum(r.started_at < first_end for r in requests) <= 2
    assert server.deployments.get(server_model_id="large").slots == 2


def test_an_idle_router_loads_back_what_interactive_work_used(router, switchyard):
    """Restore on idle against the real router: `tiny` served a person, a normal request for
    `large` evicted it, and once the router is idle Switchyard loads `tiny` back (evicting
    `large`). `tiny`'s measured load time is set to a minute, as a big model's would be:
    restoring a 5 MB model that loads in a blink does not pay."""
    server = discovered(router, max_llm=1)
    live = switchyard(MIN_RESIDENCY_S="0", NORMAL_WARM_WINDOW_S="0")
    assert_words(chat(live, "tiny", priority="interactive")["choices"][0]["message"]["content"])
    server.deployments.filter(server_model_id="tiny").update(avg_load_s=60.0)
    assert_words(chat(live, "large")["choices"][0]["message"]["content"])

    def restored() -> bool:
        now = router_states(router)
        return (now["tiny"], now["large"]) == ("loaded", "unloaded")

    eventually(restored, what="tiny loaded back, large unloaded")
    eventually(lambda: matches_router(server, router), what="deployments match the router")
    tiny = server.deployments.get(server_model_id="tiny")
    assert (tiny.load_cause, tiny.displaced) == ("restore", False)
    assert server.deployments.get(server_model_id="large").displaced


def test_embeddings_from_an_embeddings_preset(router, switchyard):
    discovered(router)
    live = switchyard()
    answer = live.post("/v1/embeddings", {"model": "embed", "input": ["hello", "world"]})
    assert answer.status_code == 200, (answer.text, live.log())
    data = answer.json()["data"]
    assert [len(d["embedding"]) for d in data] == [tiny_gguf.SMALL.dim] * 2


def test_an_input_too_large_fails_alone_and_trips_no_breaker(router, switchyard):
    """llama-server answers an embedding input over its batch size with a 500: the request
    itself is wrong, so it fails at once with the server's message (it was retried, and
    its failures opened the breaker of the whole server, for every model on it)."""
    server = discovered(router)
    live = switchyard()
    too_large = live.post("/v1/embeddings", {"model": "embed", "input": "word " * 2000})
    assert too_large.status_code == 400, too_large.text
    assert "too large to process" in too_large.json()["error"]["message"]
    assert Request.objects.get().attempts == 1
    server.refresh_from_db()
    assert (server.health, server.consecutive_failures) == ("up", 0)
    answer = live.post("/v1/embeddings", {"model": "embed", "input": "hello"})
    assert answer.status_code == 200, answer.text


def test_a_prompt_longer_than_the_context_says_so_in_openais_code(router, switchyard):
    """llama-server refuses a prompt over the model's context (`tiny`: 512 tokens) with its
    own error type; the app gets OpenAI's `context_length_exceeded` (what its SDK and
    frameworks check to shorten the prompt and try again), at once, not retried."""
    discovered(router)
    live = switchyard()
    long = [{"role": "user", "content": "word " * 2000}]
    refused = live.post("/v1/chat/completions", {"model": "tiny", "messages": long})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("context_length_exceeded", "invalid_request_error")
    assert "exceeds the available context size (512 tokens)" in error["message"]
    assert Request.objects.get().attempts == 1


def test_a_model_the_router_does_not_have(router, switchyard):
    server = discovered(router)
    ghost = Model.objects.create(name="ghost")
    Deployment.objects.create(server=server, model=ghost, server_model_id="not-on-the-router")
    live = switchyard(LOAD_ATTEMPTS="1")
    unknown = live.post("/v1/chat/completions", {"model": "nobody", "messages": CHAT})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"

    answer = live.post("/v1/chat/completions", {"model": "ghost", "messages": CHAT})
    assert answer.status_code == 404, answer.text
    assert "not-on-the-router" in answer.json()["error"]["message"]
    assert router_states(router)["tiny"] == "unloaded"  # nothing else was touched


def test_a_broken_model_file_fails_its_load_and_the_eviction_it_caused_is_seen(router, switchyard):
    """Switchyard thinks there is room for two models; the router has room for one and,
    loading the broken file, evicts the loaded model before the load fails."""
    server = discovered(router, max_llm=2)
    live = switchyard(LOAD_ATTEMPTS="1")
    chat(live, "tiny")
    answer = live.post("/v1/chat/completions", {"model": "broken", "messages": CHAT})
    assert answer.status_code == 503, answer.text
    assert "exit code 1" in answer.json()["error"]["message"]
    assert router_states(router)["tiny"] == "unloaded"
    assert router.status("broken")["failed"] is True
    eventually(lambda: matches_router(server, router), what="deployments match the router")
    assert states(server)["broken"] in (DS.FAILED, DS.UNLOADED)

    assert_words(chat(live, "tiny")["choices"][0]["message"]["content"])  # loads again


def test_an_unload_behind_switchyards_back_is_seen_by_status_sync(router, switchyard):
    server = discovered(router)
    live = switchyard(STATUS_SYNC_S="0.5")
    chat(live, "tiny")
    assert states(server)["tiny"] == DS.LOADED
    assert router.api("POST", "/models/unload", json={"model": "tiny"}).status_code == 200
    eventually(lambda: states(server)["tiny"] == DS.UNLOADED, what="tiny seen unloaded")
    assert_words(chat(live, "tiny")["choices"][0]["message"]["content"])


def test_a_model_unloaded_mid_stream_ends_the_stream_with_an_error_event(router, switchyard):
    """The router cuts the stream (a bare `proxy error` line, no [DONE]) once the child's
    stop-timeout has passed: the caller gets an error event, then [DONE]. The stream is
    long enough to outlast that timeout (400 tokens once ended within it, on a fast VM)."""
    server = discovered(router)
    live = switchyard()
    body = {"model": "large", "prompt": "Once", "max_tokens": 3000}
    with live.stream("/v1/completions", body) as response:
        lines = response.iter_lines()
        first = []
        for line in lines:
            if line.startswith("data: "):
                first.append(line)
                break
        assert router.api("POST", "/models/unload", json={"model": "large"}).status_code == 200
        rest = events([*first, *lines])
    assert rest[-1] == "[DONE]", rest[-3:]
    assert "error" in rest[-2], rest[-3:]
    error = rest[-2]["error"]
    assert error["code"] == "connection"
    assert "proxy error" in error["message"]
    assert all("choices" in chunk for chunk in rest[:-2])
    request = Request.objects.get()
    assert request.state == State.FAILED
    eventually(lambda: states(server)["large"] == DS.UNLOADED, what="large seen unloaded")


def test_the_server_killed_mid_request_and_restarted(router, switchyard):
    server = discovered(router)
    live = switchyard(
        REQUEST_ATTEMPTS="20", BREAKER_FAILURES="2", BREAKER_COOLDOWN_S="1", STATUS_SYNC_S="1"
    )
    chat(live, "large")
    with live.stream("/v1/completions", {"model": "large", "prompt": "x", "max_tokens": 8}):
        pass
    # The router is frozen (SIGSTOP) before the call, so the call is surely in flight when the
    # router dies: the tiny model can answer 100 tokens faster than a test can see it start.
    body = {"model": "large", "messages": CHAT, "max_tokens": 100}
    # The stream above may still be ending (its caller left at once): watch this call only.
    earlier = list(Request.objects.values_list("pk", flat=True))
    router.signal(signal.SIGSTOP)
    with ThreadPoolExecutor(1) as caller:
        answer = caller.submit(live.http.post, "/v1/chat/completions", json=body, timeout=300)
        sent = Request.objects.filter(state=State.PROCESSING).exclude(pk__in=earlier)
        eventually(sent.exists, what="the call sent to the frozen router")
        router.kill()
        eventually(
            lambda: Server.objects.get(pk=server.pk).health in ("down", "cooldown"),
            what="the breaker opened",
        )
        router.start()
        response = answer.result()
    assert response.status_code == 200, (response.text, live.log())
    assert_words(response.json()["choices"][0]["message"]["content"])
    request = Request.objects.exclude(pk__in=earlier).get()
    assert request.attempts >= 2, list(request.traces.values_list("to_state", "reason"))
    eventually(lambda: Server.objects.get(pk=server.pk).health == "up", what="server up again")


async def test_load_progress_as_the_real_router_reports_it(router):
    """b11434 reports a load's progress as `status_change` events (0.0, then 1.0 with the
    default mmap load), then `loaded`."""
    adapter = LlamaCppAdapter(router.url)
    seen: list[float] = []
    try:
        await adapter.load(LoadTarget("large", timeout_s=60), seen.append)
        assert seen[0] == 0.0 and seen[-1] == 1.0
        assert seen == sorted(seen)
        assert [(m.id, m.state) for m in await adapter.list_models() if m.state != "unloaded"] == [
            ("large", "loaded")
        ]
        await adapter.unload("large")  # returns on the child's `unloaded` event
        assert router.status("large")["value"] == "unloaded"
    finally:
        await adapter.close()


def test_load_progress_reaches_the_watch_page_and_the_dashboard(
    llama_server_binary, tiny_models, tmp_path, switchyard
):
    """The router's own figure for a load, relayed as it comes: on the caller's watch page
    and on the dashboard, not an estimate. A 16k context makes the 100 MB model's load end
    ~1 s after its progress reaches 1.0; the model's own process is frozen there (the
    router itself still answers Switchyard), so the test reads the state at leisure, then
    thaws it."""
    sections = {"*": {"c": 1024, "np": 2}, "slow": {"model": tiny_models["tiny-100mb"], "c": 16384}}
    preset = tmp_path / "models.ini"
    preset.write_text(real_llama.preset(sections))
    router = real_llama.RealLlamaServer(["--models-preset", str(preset)], tmp_path)
    listening, frozen = threading.Event(), threading.Event()
    children: list[int] = []

    def freeze_the_model_at_full_progress() -> None:
        with httpx.stream("GET", router.url + "/models/sse", timeout=None) as events:
            listening.set()
            for line in events.iter_lines():
                if '"value":1.0' in line and '"model":"slow"' in line:
                    children.extend(child_pids(router.proc.pid))
                    for pid in children:
                        os.kill(pid, signal.SIGSTOP)
                    frozen.set()
                    return

    def thaw() -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    try:
        discovered(router)
        live = switchyard()
        threading.Thread(target=freeze_the_model_at_full_progress, daemon=True).start()
        assert listening.wait(WAIT_S)
        body = {"model": "slow", "messages": CHAT, "max_tokens": 8}
        with live.stream("/v1/chat/completions", body) as response:
            watch = response.headers["X-Switchyard-Watch-Url"] + "state.json"
            assert frozen.wait(WAIT_S), "the router never reported the load's progress"
            assert children, "the router started no process for the model"

            def loading() -> dict | None:
                shown = live.http.get(watch).json()
                return shown if (shown["load"] or {}).get("fraction") == 1.0 else None

            shown = eventually(loading, what="the load's progress on the watch page")
            assert shown["load"]["estimated"] is False
            assert shown["state"] == State.NEEDS_LOADING, shown
            assert "the load of slow on router, 100% after " in shown["reason"], shown
            deployments = [d for s in overview()["servers"] for d in s["models"]]
            assert [(d["model"], d["state"], d["progress"]["fraction"]) for d in deployments] == [
                ("slow", "loading", 1.0)
            ]
            thaw()
            assert events(response.iter_lines())[-1] == "[DONE]"
        shown = live.http.get(watch).json()
        assert (shown["state"], shown["load"]) == ("completed", None)
    finally:
        thaw()
        router.stop()


def test_a_load_nobody_waits_for_gives_way(llama_server_binary, tiny_models, tmp_path, switchyard):
    """A load that never ends by itself: `slow`'s file becomes a named pipe once the router
    has read it, so its child waits on it for good. Its one request is cancelled: a request
    for `tiny` stops that load (`POST /models/unload` on a loading model; the router lists it
    `unloaded`, `failed: true`) and is served at once. Without the stop it would wait for the
    load's timeout, and the model would count a failed load."""
    slow = tmp_path / "slow.gguf"
    shutil.copy(tiny_models["tiny-5mb"], slow)
    sections = {
        "*": {"c": 1024, "np": 2, "stop-timeout": 2},
        "tiny": {"model": tiny_models["tiny-5mb"]},
        "slow": {"model": str(slow)},
    }
    preset = tmp_path / "models.ini"
    preset.write_text(real_llama.preset(sections))
    router = real_llama.RealLlamaServer(
        ["--models-preset", str(preset), "--models-max", "1"], tmp_path
    )
    try:
        slow.unlink()
        os.mkfifo(slow)  # opened by the model's own process, which never reads a byte
        server = discovered(router, max_llm=1)
        Model.objects.filter(name="slow").update(load_timeout_s=120)
        live = switchyard()
        body = {"model": "slow", "messages": CHAT, "max_tokens": 8}
        job = live.post("/api/v1/requests", {"kind": "chat", "body": body}).json()
        eventually(lambda: router.status("slow")["value"] == "loading", what="slow loading")
        eventually(lambda: states(server)["slow"] == DS.LOADING, what="slow loading, as we see it")
        assert live.http.delete(f"/api/v1/requests/{job['id']}").status_code == 200

        assert_words(chat(live, "tiny")["choices"][0]["message"]["content"])
        assert router.status("slow")["failed"] is True  # as the router says of a stop
        assert router_states(router) == {"slow": "unloaded", "tiny": "loaded"}
        stopped = Deployment.objects.get(model__name="slow")
        assert (stopped.state, stopped.load_failures, stopped.last_error) == (DS.UNLOADED, 0, "")
    finally:
        router.stop()


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (the router's: one per model it runs), from any of its
    threads."""
    tasks = Path(f"/proc/{pid}/task").glob("*/children")
    return [int(c) for task in tasks for c in task.read_text().split()]


def test_a_caller_that_hangs_up_mid_stream_stops_the_routers_child(router, switchyard):
    """Through the router too: Switchyard closes its call, the router closes its own to the
    child, and the child cancels the task (left alone: ~500 tokens, several seconds)."""
    discovered(router)
    live = switchyard()
    body = {"model": "large", "prompt": "Once", "max_tokens": 5000, "ignore_eos": True}
    with live.stream("/v1/completions", body) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))
    eventually(lambda: "cancel task" in router.log(), what="the child cancels the task")
    eventually(lambda: Request.objects.get().state == State.CANCELLED, what="cancelled")


def test_switchyard_keeps_to_the_routers_room(router, switchyard):
    """The router runs one model (--models-max 1), of every type alike; Switchyard's row
    allows an LLM and an embedding model there. The worker learns the router's room from
    its /props, so while the LLM streams an embedding request waits for the stream to end
    (saying so), and then Switchyard unloads the LLM and loads the embedding model itself.
    Without it, the router refused the load ("model limit reached", asked again with
    backoff), or stopped the LLM behind Switchyard's back."""
    server = discovered(router)
    assert server.max_models is None
    live = switchyard()
    embed = server.deployments.get(server_model_id="embed")
    body = {"model": "large", "prompt": "Once", "max_tokens": 1000, "ignore_eos": True}
    with live.stream("/v1/completions", body) as response:
        lines = response.iter_lines()  # kept: a closed iterator closes the call
        next(line for line in lines if line.startswith("data: "))

        def learnt() -> bool:
            server.refresh_from_db()
            return server.max_models == 1

        eventually(learnt, what="the worker learning the router's room")
        job = live.post(
            "/api/v1/requests", {"kind": "embedding", "body": {"model": "embed", "input": "hi"}}
        ).json()

        def waiting_for_the_stream() -> dict | None:
            shown = live.http.get(f"/api/v1/requests/{job['id']}").json()
            said = (shown["reason"] or {}).get("text", "")
            return shown if "router first finishes the 1 running on large" in said else None

        eventually(waiting_for_the_stream, what="the embedding request waiting, saying why")
        assert events(lines)[-1] == "[DONE]"  # the stream ran to its end
    done = live.http.get(f"/api/v1/requests/{job['id']}", params={"wait_s": 60})
    assert done.json()["state"] == State.COMPLETED, (done.json(), live.log())
    embed.refresh_from_db()
    assert (embed.state, embed.load_failures, embed.last_error) == (DS.LOADED, 0, "")
    assert {k: v for k, v in router_states(router).items() if v != "unloaded"} == {
        "embed": "loaded"
    }
    assert "model limit reached" not in router.log()

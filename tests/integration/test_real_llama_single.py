"""The real `llama-server` (b11434) one model at a time: Switchyard's `openai` kind in front
of a single-model server and of the router (which loads on demand and queues by itself),
and the `llamacpp` kind's single-model mode (503 on every route while loading; sleeping)."""

from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest
from django.core.management import call_command

from backends.checkup import OK, WARN, check_server
from backends.models import Deployment, DeploymentState, Model, ModelType, Server
from scheduler.models import Request, State
from tests.integration.conftest import eventually
from tests.integration.test_real_llama_router import (
    CHAT,
    assert_words,
    chat,
    streamed,
    text_of,
)

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")
from tests.support import tiny_gguf  # noqa: E402 (needs gguf)

pytestmark = pytest.mark.integration


def deploy(server: Server, name: str, server_model_id: str, type: str = ModelType.LLM) -> None:
    model = Model.objects.create(name=name, type=type)
    Deployment.objects.create(server=server, model=model, server_model_id=server_model_id)


def test_openai_kind_in_front_of_a_single_model_server(single, switchyard):
    llama = single(tiny_gguf.SMALL.name)
    server = Server.objects.create(name="one", kind="openai", base_url=llama.url, health="up")
    call_command("sync_models", "one")  # the listing's id is the --alias
    assert list(server.deployments.values_list("server_model_id", flat=True)) == ["tiny-5mb"]
    live = switchyard()
    assert_words(chat(live, "tiny-5mb")["choices"][0]["message"]["content"])
    body = {"model": "tiny-5mb", "messages": CHAT, "max_tokens": 8}
    chunks = streamed(
        live, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # and content null
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] == 8
    assert chunks[-1] == "[DONE]"
    assert_words(text_of(chunks))
    answer = live.post("/v1/completions", {"model": "tiny-5mb", "prompt": "Once", "max_tokens": 4})
    assert_words(answer.json()["choices"][0]["text"])

    # Started without --embeddings it answers 501: the caller hears it, nothing is retried.
    deploy(server, "no-embed", "tiny-5mb", ModelType.EMBEDDING)
    refused = live.post("/v1/embeddings", {"model": "no-embed", "input": "x"})
    assert refused.status_code >= 400
    assert "--embeddings" in refused.json()["error"]["message"]
    assert Request.objects.get(model_name="no-embed").attempts == 1


def test_openai_kind_in_front_of_the_router_which_loads_and_queues_by_itself(router, switchyard):
    """No load control: the router loads whatever a request names (room for one), and a
    request for another model waits in the router's queue until the busy one is idle."""
    server = Server.objects.create(
        name="auto", kind="openai", base_url=router.url, slots=2, health="up"
    )
    call_command("sync_models", "auto")
    live = switchyard()
    assert_words(chat(live, "tiny")["choices"][0]["message"]["content"])
    body = {"model": "large", "prompt": "Once", "max_tokens": 60}
    with ThreadPoolExecutor(1) as caller, live.stream("/v1/completions", body) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):  # large is loaded and busy
                break
        queued = caller.submit(chat, live, "tiny")  # held by the router until large is idle
        assert "data: [DONE]" in list(lines)
        quick = queued.result()
    assert_words(quick["choices"][0]["message"]["content"])
    large, tiny = (
        Request.objects.filter(model_name=m).latest("created_at") for m in ("large", "tiny")
    )
    assert large.state == tiny.state == State.COMPLETED
    assert tiny.finished_at >= large.finished_at
    assert router.status("tiny")["value"] == "loaded"
    assert router.status("large")["value"] == "unloaded"
    assert server.deployments.count() == 4


def test_llamacpp_single_mode_while_loading_then_serving(single, switchyard):
    """Every route, the listing too, answers 503 "Loading model" until the model is in:
    discovery says so, a request waits for the load instead of failing."""
    llama = single(tiny_gguf.LARGE.name, wait_loaded=False)
    server = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    loading = llama.api("GET", "/v1/models")
    if loading.status_code == 503:  # it may already be loaded on a fast day
        assert loading.json()["error"] == {
            "message": "Loading model",
            "type": "unavailable_error",
            "code": 503,
        }
    deploy(server, "big", tiny_gguf.LARGE.name)
    live = switchyard()
    assert_words(chat(live, "big")["choices"][0]["message"]["content"])
    call_command("sync_models", "one")
    assert list(server.deployments.values_list("server_model_id", "size_mb", "slots")) == [
        (tiny_gguf.LARGE.name, 92, 2)  # its slots: `-np 2`, as its /props says
    ]


# A chat template that takes tools: llama-server tries it with some (`--jinja`) and says so.
TOOLS_TEMPLATE = """\
{%- if tools %}<|system|>You may call: {{ tools | tojson }}
{% endif -%}
{%- for message in messages -%}<|{{ message.role }}|>{{ message.content }}
{% endfor -%}
{%- if add_generation_prompt %}<|assistant|>{% endif -%}
"""


def test_discovery_fills_what_a_model_takes_as_the_real_server_says(single, switchyard, tmp_path):
    """The template's tools (`chat_template_caps` in /props) become the model's capabilities,
    and a slot's context (`n_ctx`) its context length, which apps then see in `/v1/models`
    and Ollama's `/api/show`."""
    template = tmp_path / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    llama = single(tiny_gguf.SMALL.name, "--jinja", "--chat-template-file", str(template))
    Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    call_command("sync_models", "one")
    model = Model.objects.get(name=tiny_gguf.SMALL.name)
    n_ctx = httpx.get(f"{llama.url}/props").json()["default_generation_settings"]["n_ctx"]
    assert (model.capabilities, model.context_length) == (["tools"], n_ctx)
    assert 0 < n_ctx <= 512  # `-c 512` over its two slots
    live = switchyard()
    shown = live.post("/api/show", {"model": tiny_gguf.SMALL.name}).json()
    assert shown["capabilities"] == ["completion", "tools"]
    assert shown["model_info"]["switchyard.context_length"] == n_ctx
    listed = live.http.get("/v1/models").json()["data"]
    assert [(m.get("capabilities"), m.get("context_length")) for m in listed] == [
        (["tools"], n_ctx)
    ]


def test_check_servers_tells_the_real_server_apart_and_names_a_wrong_kind(single, router, db):
    """The real llama-server, single-model and router, answers as llamacpp; set up as
    `openai`, the check says Switchyard could load and unload there with kind llamacpp."""
    llama = single(tiny_gguf.SMALL.name)
    one = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url)
    as_openai = Server.objects.create(name="plain", kind="openai", base_url=router.url)
    deploy(one, "tiny", tiny_gguf.SMALL.name)

    checked = check_server(one)
    assert checked.worst == OK, str(checked)
    assert f"answers at {llama.url} as llamacpp" in str(checked)
    wrong = check_server(as_openai)
    assert wrong.worst == WARN
    assert "answers as llamacpp, set up as openai" in str(wrong)
    # The router runs one model at once (--models-max 1): an LLM and an embedding model
    # kept by Switchyard would have it stop one behind Switchyard's back.
    routed = Server.objects.create(name="routed", kind="llamacpp", base_url=router.url)
    deploy(routed, "tiny-llm", "tiny")
    deploy(routed, "tiny-embed", "embed", ModelType.EMBEDDING)
    crowded = check_server(routed)
    assert crowded.worst == WARN, str(crowded)
    assert "the router runs at most 1 model at once" in str(crowded)


def test_llamacpp_single_mode_sleeps_and_wakes(single, switchyard):
    llama = single(tiny_gguf.SMALL.name, "--sleep-idle-seconds", "1")
    server = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    call_command("sync_models", "one")
    live = switchyard(STATUS_SYNC_S="0.5")
    assert_words(chat(live, "tiny-5mb")["choices"][0]["message"]["content"])
    eventually(lambda: llama.api("GET", "/props").json()["is_sleeping"], what="asleep")
    assert llama.api("GET", "/health").status_code == 200  # asleep, still healthy
    # Asleep its memory is free: the status sync counts it as not loaded...
    eventually(
        lambda: server.deployments.get().state == DeploymentState.UNLOADED,
        what="the sleep seen by the status sync",
    )
    # ...and the next request wakes it.
    assert_words(chat(live, "tiny-5mb")["choices"][0]["message"]["content"])
    assert Request.objects.filter(state=State.COMPLETED).count() == 2


@pytest.mark.parametrize("path", ["/v1/completions", "/api/v1/requests"])
def test_a_stopped_request_stops_the_generation(single, switchyard, path):
    """A streamed generation whose caller hangs up after its first chunk, or a job cancelled
    with DELETE while it generates: the request ends `cancelled` and llama-server cancels
    its task (its log says so), and its slot is idle again. Left alone it would generate
    its whole slot's context (~500 tokens, on one thread: seconds), which it must still be
    doing when it notices the closed connection: of a call that is not streamed, about a
    second after Switchyard closes it (measured: Switchyard stops the call within 1 ms of
    the cancel's wake-up). With 250 tokens on two threads it ended first on a fast VM."""
    llama = single(tiny_gguf.LARGE.name, "-t", "1", ctx=1024)
    server = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    deploy(server, "big", tiny_gguf.LARGE.name)
    live = switchyard()
    body = {"model": "big", "prompt": "Once", "max_tokens": 5000, "ignore_eos": True}
    if path == "/v1/completions":
        with live.stream(path, body) as response:
            next(line for line in response.iter_lines() if line.startswith("data: "))
    else:
        job = live.post(path, {"kind": "completion", "body": body}).json()
        eventually(lambda: Request.objects.get().state == State.PROCESSING, what="processing")
        assert live.http.delete(f"{path}/{job['id']}").json()["state"] == State.CANCELLED
    eventually(lambda: "cancel task" in llama.log(), what="llama-server cancels the task")
    assert Request.objects.get().state == State.CANCELLED
    slots = llama.api("GET", "/slots").json()
    assert not any(slot["is_processing"] for slot in slots)


def test_rerank_through_the_real_server(single, switchyard):
    """A server started with `--reranking` answers `/v1/rerank`: Switchyard schedules the
    request as any other and relays the server's ranking as it is."""
    llama = single(tiny_gguf.SMALL.name, "--reranking")
    server = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    deploy(server, "ranker", tiny_gguf.SMALL.name, ModelType.RERANKING)
    live = switchyard()
    body = {"query": "hello", "documents": ["hi there", "bye now", "hello world"], "top_n": 2}
    answer = live.post("/v1/rerank", {"model": "ranker", **body})
    assert answer.status_code == 200, answer.text
    direct = llama.api("POST", "/v1/rerank", json={"model": tiny_gguf.SMALL.name, **body}).json()
    assert answer.json()["results"] == direct["results"]  # the same ranking, relayed
    assert len(direct["results"]) == 2
    assert Request.objects.get().state == State.COMPLETED


def test_the_responses_api_through_the_real_server(single, switchyard):
    """`POST /v1/responses` (OpenAI's Responses API), answered and streamed by the real
    server through the scheduler, read with the OpenAI client: its stream ends with
    `response.completed` (no [DONE] upstream), whose response is what is stored."""
    llama = single(tiny_gguf.SMALL.name)
    server = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    deploy(server, "tiny", tiny_gguf.SMALL.name)
    live = switchyard()
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)

    answer = client.responses.create(model="tiny", input="Say something.", max_output_tokens=8)
    assert_words(answer.output_text)
    assert answer.usage.output_tokens > 0 and answer.usage.input_tokens > 0

    stream = client.responses.create(
        model="tiny",
        input=[{"role": "user", "content": "Say something."}],
        stream=True,
        max_output_tokens=8,
    )
    seen = list(stream)
    kinds = [event.type for event in seen]
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert_words(deltas)
    assert seen[-1].response.output_text == deltas

    stored = Request.objects.filter(kind="response").order_by("created_at")
    assert [r.state for r in stored] == [State.COMPLETED, State.COMPLETED]
    assert [r.result["object"] for r in stored] == ["response", "response"]
    assert stored[1].result["output"][0]["content"][0]["text"] == deltas


def test_anthropics_messages_api_through_the_real_server(single, switchyard):
    """`POST /v1/messages` (Anthropic's Messages API), as Claude Code and Anthropic's client
    call it, answered and streamed by the real server through the scheduler."""
    llama = single(tiny_gguf.SMALL.name)
    server = Server.objects.create(name="one", kind="llamacpp", base_url=llama.url, health="up")
    deploy(server, "tiny", tiny_gguf.SMALL.name)
    client = anthropic.Anthropic(base_url=switchyard().url, api_key="none", max_retries=0)
    hi = [{"role": "user", "content": "Say something."}]

    answer = client.messages.create(model="tiny", max_tokens=8, system="Be brief.", messages=hi)
    assert_words(answer.content[0].text)
    assert answer.usage.output_tokens == 8 and answer.stop_reason == "max_tokens"

    with client.messages.stream(model="tiny", max_tokens=8, messages=hi) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert_words(text)
    assert final.content[0].text == text and final.usage.output_tokens == 8
    stored = Request.objects.filter(kind="message").order_by("created_at")
    assert [r.state for r in stored] == [State.COMPLETED, State.COMPLETED]
    assert stored[1].result["content"] == [{"type": "text", "text": text}]
    assert stored[1].result["usage"]["output_tokens"] == 8

    # Its tokens counted (Claude Code asks at start): the server's own count, as asked of it.
    counted = client.messages.count_tokens(model="tiny", system="Be brief.", messages=hi)
    body = {"model": tiny_gguf.SMALL.name, "system": "Be brief.", "messages": hi}
    direct = llama.api("POST", "/v1/messages/count_tokens", json=body).json()
    assert counted.input_tokens == direct["input_tokens"] > 0
    assert Request.objects.get(kind="count_tokens").state == State.COMPLETED

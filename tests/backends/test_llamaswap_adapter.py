"""llama-swap adapter against a replay of llama-swap's API (§5)."""

from collections.abc import Callable

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.llamaswap import LlamaSwapAdapter
from tests.support.replay_server import Reply, Stream, sse

MODELS = {
    "object": "list",
    "data": [
        {
            "id": "nomic-embed",
            "object": "model",
            "owned_by": "llama-swap",
            "status": {"value": "unloaded"},
        },
        {
            "id": "gpt-4o-mini",
            "object": "model",
            "meta": {"llamaswap": {"type": "alias"}},
            "status": {"value": "loaded"},
        },
        {
            "id": "qwen-7b",
            "object": "model",
            "meta": {"llamaswap": {"type": "model", "aliases": ["gpt-4o-mini"]}},
            "status": {"value": "loaded"},
            "context_length": 8192,  # where its config sets one
        },
    ],
}
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


def running(state: str | None) -> Reply:
    entries = [{"model": "qwen-7b", "state": state, "ttl": 300}] if state else []
    return Reply(200, {"running": entries})


def own_error(status: int, message: str, code: str) -> Reply:
    body = {
        "src": "llama-swap",
        "error": {"message": message, "type": "server_error", "param": None, "code": code},
    }
    return Reply(status, body)


@pytest.fixture
def make_adapter() -> Callable[[str], LlamaSwapAdapter]:
    return LlamaSwapAdapter


async def test_lists_configured_models_with_running_state(server, adapter):
    server.on("GET", "/v1/models", Reply(200, MODELS))
    server.on("GET", "/running", running("starting"), running("ready"), running("stopping"))
    assert [(m.id, m.state) for m in await adapter.list_models()] == [
        ("nomic-embed", "unloaded"),
        ("qwen-7b", "loading"),
    ]
    assert [m.state for m in await adapter.list_models()] == ["unloaded", "loaded"]
    listed = await adapter.list_models()
    assert [(m.state, m.context_length) for m in listed] == [("unloaded", None), ("unloaded", 8192)]


async def test_discovery_reads_a_running_llama_servers_slots_and_starts_nothing(server, adapter):
    """`/upstream/<model>/props` would start a stopped model: it is asked only of a model
    `/running` says is ready, just before; an upstream with no /props says nothing."""
    server.on("GET", "/v1/models", Reply(200, MODELS))
    server.on("GET", "/running", running("ready"))
    server.on("GET", "/upstream/qwen-7b/props", Reply(200, {"total_slots": 4}))
    listed = await adapter.list_models()
    assert await adapter.model_facts(listed) == {"qwen-7b": {"slots": 4}}
    assert ("GET", "/upstream/nomic-embed/props") not in server.calls()

    server.on("GET", "/running", running("stopping"))
    assert await adapter.model_facts(listed) == {}  # stopped in between: not asked
    assert server.calls().count(("GET", "/upstream/qwen-7b/props")) == 1
    server.on("GET", "/running", running("ready"))
    server.on("GET", "/upstream/qwen-7b/props", Reply(404, "404 page not found"))
    assert await adapter.model_facts(listed) == {}


async def test_load_starts_the_upstream_without_an_inference(server, adapter):
    server.on("GET", "/running", running(None), running("ready"))
    server.on("GET", "/upstream/qwen-7b/health", Reply(200, {"status": "ok"}))
    await adapter.load(LoadTarget("qwen-7b"), lambda f: None)
    assert server.calls() == [
        ("GET", "/running"),
        ("GET", "/upstream/qwen-7b/health"),
        ("GET", "/running"),
    ]


async def test_load_accepts_an_upstream_without_health_route(server, adapter):
    server.on("GET", "/running", running(None), running("ready"))
    server.on("GET", "/upstream/qwen-7b/health", Reply(404, {"detail": "Not Found"}))
    await adapter.load(LoadTarget("qwen-7b"), lambda f: None)


async def test_load_of_a_ready_model_does_nothing(server, adapter):
    server.on("GET", "/running", running("ready"))
    await adapter.load(LoadTarget("qwen-7b"), lambda f: None)
    assert server.calls() == [("GET", "/running")]


async def test_a_failed_start_is_a_load_failure(server, adapter):
    server.on("GET", "/running", running(None))
    message = "unspecific error: health check timed out after 120s"
    server.on("GET", "/upstream/qwen-7b/health", own_error(500, message, "internal_error"))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("qwen-7b"), lambda f: None)
    assert (raised.value.code, raised.value.message) == (ErrorCode.LOAD_FAILED, message)


async def test_load_of_an_unknown_model_is_not_found(server, adapter):
    server.on("GET", "/running", running(None))
    server.on("GET", "/upstream/nope/health", own_error(404, "model not found", "not_found"))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("nope"), lambda f: None)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_unload(server, adapter):
    server.on("POST", "/api/models/unload/qwen-7b", Reply(200, "OK"))
    await adapter.unload("qwen-7b")
    assert server.calls() == [("POST", "/api/models/unload/qwen-7b")]


async def test_inference_on_a_stopped_model_is_refused_before_sending(server, adapter):
    server.on("GET", "/running", running("starting"))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "qwen-7b", CHAT))
    assert raised.value.code == ErrorCode.NOT_LOADED
    assert server.calls() == [("GET", "/running")]


async def test_streamed_chat_drops_loading_text(server, adapter):
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "qwen-7b"}
    loading = {"choices": [{"delta": {"reasoning_content": "llama-swap loading model: qwen-7b"}}]}
    real = {**head, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    done = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    server.on("GET", "/running", running("ready"))
    server.on("POST", "/v1/chat/completions", Stream(sse(loading, real, done)))
    call = InferenceCall("chat", "qwen-7b", {**CHAT, "stream": True}, stream=True)
    assert [c async for c in adapter.stream(call)] == [real, done]
    assert server.body_of("POST", "/v1/chat/completions") == {
        **CHAT,
        "model": "qwen-7b",
        "stream": True,
        "stream_options": {"include_usage": True},  # always: the stored answer counts it
    }


async def test_concurrency_limit_is_busy_with_retry_after(server, adapter):
    server.on("GET", "/running", running("ready"))
    body = {
        "src": "llama-swap",
        "error": {
            "message": "Too many requests",
            "type": "rate_limit_error",
            "param": None,
            "code": "concurrency_limit",
        },
    }
    server.on("POST", "/v1/chat/completions", Reply(429, body, {"Retry-After": "1"}))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "qwen-7b", CHAT))
    assert (raised.value.code, raised.value.retry_after_s) == (ErrorCode.BUSY, 1.0)
    assert raised.value.message == "Too many requests"


async def test_upstream_errors_pass_through(server, adapter):
    server.on("GET", "/running", running("ready"))
    error = {
        "error": {
            "code": 400,
            "message": "Failed to parse grammar",
            "type": "invalid_request_error",
        }
    }
    server.on("POST", "/v1/completions", Reply(400, error))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("completion", "qwen-7b", {"prompt": "x"}))
    assert (raised.value.code, raised.value.message) == (
        ErrorCode.BAD_REQUEST,
        "Failed to parse grammar",
    )


async def test_health(server, adapter):
    server.on("GET", "/health", Reply(200, "OK"))
    await adapter.health()


async def test_a_streamed_response_keeps_its_typed_events(server, adapter):
    """A Responses API stream's events have a type, not an id or object: they are the
    model's output, not loading text."""
    loading = {"choices": [{"delta": {"reasoning_content": "llama-swap loading model: qwen-7b"}}]}
    delta = {"type": "response.output_text.delta", "delta": "Hi"}
    done = {"type": "response.completed", "response": {"object": "response", "output": []}}
    server.on("GET", "/running", running("ready"))
    server.on("POST", "/v1/responses", Stream(sse(loading, delta, done, done=False)))
    call = InferenceCall("response", "qwen-7b", {"input": "hi", "stream": True}, stream=True)
    assert [c async for c in adapter.stream(call)] == [delta, done]

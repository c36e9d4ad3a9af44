"""llama.cpp adapter against replays of llama-server in single-model and router mode (§4)."""

import json
from collections.abc import Callable
from functools import partial

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.llamacpp import LlamaCppAdapter
from tests.support.replay_server import Reply, Stream, sse

GEMMA = "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"
ARGS = ["llama-server", "-ctx", "4096"]
SINGLE = {
    "object": "list",
    "data": [
        {
            "id": "../models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
            "object": "model",
            "created": 1735142223,
            "owned_by": "llamacpp",
            "meta": {"n_ctx_train": 131072},
        }
    ],
}
LOADING = Reply(
    503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
)
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


def router(*statuses: dict) -> Reply:
    data = [
        {"id": GEMMA, "aliases": ["gemma"], "object": "model", "status": statuses[0]},
        {"id": "nomic", "aliases": [], "object": "model", "status": statuses[1]},
    ]
    return Reply(200, {"object": "list", "data": data})


def status_event(status: str, event: str = "status_change", **extra) -> str:
    """As the real router (b11434) sends them: only a load's first event is `model_status`."""
    return json.dumps({"model": GEMMA, "event": event, "data": {"status": status, **extra}})


@pytest.fixture
def make_adapter() -> Callable[[str], LlamaCppAdapter]:
    return partial(LlamaCppAdapter, api_key="sk-local")


# -- single-model mode --------------------------------------------------------------------


async def test_single_mode_states(server, adapter):
    model_id = SINGLE["data"][0]["id"]
    server.on("GET", "/v1/models", Reply(200, SINGLE))
    server.on("GET", "/health", LOADING, Reply(200, {"status": "ok"}))
    server.on(
        "GET", "/props", Reply(200, {"is_sleeping": False}), Reply(200, {"is_sleeping": True})
    )
    assert [(m.id, m.state) for m in await adapter.list_models()] == [(model_id, "loading")]
    assert [m.state for m in await adapter.list_models()] == ["loaded"]
    assert [m.state for m in await adapter.list_models()] == ["sleeping"]


TOOLS = {"supports_tools": True, "supports_tool_calls": True, "supports_system_role": True}


async def test_single_mode_lists_the_slots_capabilities_and_context_its_props_say(server, adapter):
    """`--parallel 4` shows as `total_slots` in `/props`, a template that takes tools as
    `chat_template_caps.supports_tools`, a projector as `modalities.vision`, `--ctx-size` as
    a slot's `n_ctx`: discovery fills the deployment's slots and the model's unknown
    capabilities and context with them."""
    props = {
        "is_sleeping": False,
        "total_slots": 4,
        "default_generation_settings": {"n_ctx": 8192},
    }
    server.on("GET", "/v1/models", Reply(200, SINGLE))
    server.on("GET", "/health", Reply(200, {"status": "ok"}))
    server.on(
        "GET",
        "/props",
        Reply(200, props),
        Reply(200, {**props, "chat_template_caps": TOOLS, "modalities": {"vision": True}}),
        Reply(200, {**props, "chat_template_caps": {}, "modalities": {"vision": False}}),
    )
    listed = await adapter.list_models()
    assert [(m.slots, m.capabilities, m.context_length) for m in listed] == [(4, None, 8192)]
    assert [m.capabilities for m in await adapter.list_models()] == [("tools", "vision")]
    assert [m.capabilities for m in await adapter.list_models()] == [()]


async def test_single_mode_load_waits_for_health(server, adapter):
    server.on("GET", "/v1/models", Reply(200, SINGLE))
    server.on("GET", "/health", LOADING, LOADING, Reply(200, {"status": "ok"}))
    server.on("GET", "/props", Reply(200, {"is_sleeping": False}))
    await adapter.load(LoadTarget(SINGLE["data"][0]["id"]), lambda f: None)
    assert server.calls().count(("GET", "/health")) == 3


async def test_single_mode_cannot_unload_or_load_another_model(server, adapter):
    server.on("GET", "/v1/models", Reply(200, SINGLE))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("other.gguf"), lambda f: None)
    assert raised.value.code == ErrorCode.NOT_FOUND
    with pytest.raises(AdapterError) as raised:
        await adapter.unload(SINGLE["data"][0]["id"])
    assert raised.value.code == ErrorCode.BAD_REQUEST


async def test_single_mode_inference_while_loading_is_busy(server, adapter):
    server.on("GET", "/v1/models", Reply(200, SINGLE))
    server.on("POST", "/v1/chat/completions", LOADING)
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "m.gguf", CHAT))
    assert (raised.value.code, raised.value.message) == (ErrorCode.BUSY, "Loading model")
    assert server.requests_to("POST", "/v1/chat/completions")[0].query == {}


# -- router mode --------------------------------------------------------------------------


async def test_router_lists_every_state(server, adapter):
    server.on(
        "GET",
        "/v1/models",
        router({"value": "sleeping", "args": ARGS}, {"value": "downloading", "progress": {}}),
        router({"value": "unloaded", "args": ARGS, "failed": True, "exit_code": 1}, {"value": "x"}),
    )
    assert [(m.id, m.state) for m in await adapter.list_models()] == [
        (GEMMA, "sleeping"),
        ("nomic", "loading"),
    ]
    assert [m.state for m in await adapter.list_models()] == ["unloaded", "unloaded"]


async def test_router_lists_the_slots_and_capabilities_of_a_loaded_model_from_its_props(
    server, adapter
):
    """Only a running model's instance knows its slots (`/props?model=…`); one not running
    has none listed."""
    server.on("GET", "/v1/models", router({"value": "loaded", "args": ARGS}, {"value": "unloaded"}))
    server.on(
        "GET",
        "/props",
        Reply(200, {"total_slots": 2, "chat_template_caps": TOOLS, "modalities": {}}),
    )
    listed = await adapter.list_models()
    assert server.requests_to("GET", "/props") == []  # a listing (health, status sync) asks none
    assert await adapter.model_facts(listed) == {GEMMA: {"slots": 2, "capabilities": ("tools",)}}
    assert [r.query for r in server.requests_to("GET", "/props")] == [{"model": [GEMMA]}]


async def test_router_says_what_a_model_ran_from_its_slots(server, adapter):
    """`/slots?model=…` as the real b11434 answers it: a slot never used has no `id_task`,
    one that ran keeps its last task's id once done. A model its router does not run, or
    slots turned off (501), say nothing."""
    idle = {"id": 0, "n_ctx": 512, "speculative": False, "is_processing": False}
    done = {**idle, "id": 1, "id_task": 5, "n_prompt_tokens": 10}
    server.on("GET", "/v1/models", router({"value": "loaded", "args": ARGS}, {"value": "loaded"}))
    server.on(
        "GET",
        "/slots",
        Reply(200, [idle, done]),
        Reply(200, [{**idle, "is_processing": True, "id_task": 7}, done]),
        Reply(200, [idle, idle]),
        Reply(501, {"error": {"code": 501, "message": "This server does not support slots"}}),
    )
    await adapter.list_models()  # learns it is a router
    assert await adapter.activity(GEMMA) == (0, 5)
    assert await adapter.activity(GEMMA) == (1, 7)
    assert await adapter.activity(GEMMA) == (0, -1)
    assert await adapter.activity("nomic") is None
    assert [r.query for r in server.requests_to("GET", "/slots")][0] == {"model": [GEMMA]}


async def test_router_load_follows_progress_on_the_event_stream(server, adapter):
    server.on("GET", "/v1/models", router({"value": "unloaded", "args": ARGS}, {}))
    server.on("POST", "/models/load", Reply(200, {"success": True}))
    stages = ["text_model", "mmproj_model"]
    events = [
        json.dumps({"model": "nomic", "event": "status_change", "data": {"status": "loaded"}}),
        status_event("loading", event="model_status"),
        status_event("loading", progress={"stages": stages, "current": "text_model", "value": 0.5}),
        status_event(
            "loading", progress={"stages": stages, "current": "mmproj_model", "value": 0.5}
        ),
        status_event("loaded", info={}),
    ]
    server.on(
        "GET",
        "/models/sse",
        Stream(sse(*events, done=False), after=("POST", "/models/load"), hold_open=True),
    )
    seen: list[float] = []
    await adapter.load(LoadTarget("gemma", options={"context_length": 4096}), seen.append)
    assert seen == [0.25, 0.75, 1.0]
    assert server.body_of("POST", "/models/load") == {"model": "gemma"}
    assert server.calls() == [
        ("GET", "/v1/models"),
        ("GET", "/models/sse"),
        ("POST", "/models/load"),
        ("GET", "/v1/models"),  # a load someone else ended before the stream opened?
    ]


async def test_router_load_failure_reports_the_exit_code(server, adapter):
    server.on(
        "GET",
        "/v1/models",
        router({"value": "unloaded", "args": ARGS}, {}),
        router({"value": "unloaded", "args": ARGS, "failed": True, "exit_code": 1}, {}),
    )
    server.on("POST", "/models/load", Reply(200, {"success": True}))
    events = [status_event("loading", event="model_status"), status_event("unloaded", exit_code=1)]
    server.on(
        "GET",
        "/models/sse",
        Stream(sse(*events, done=False), after=("POST", "/models/load"), hold_open=True),
    )
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget(GEMMA), lambda f: None)
    assert raised.value.code == ErrorCode.LOAD_FAILED
    assert "exit code 1" in raised.value.message


async def test_router_load_joins_a_load_already_running(server, adapter):
    server.on("GET", "/v1/models", router({"value": "unloaded", "args": ARGS}, {}))
    error = {
        "error": {
            "code": 400,
            "message": "model is already running",
            "type": "invalid_request_error",
        }
    }
    server.on("POST", "/models/load", Reply(400, error))
    server.on(
        "GET",
        "/models/sse",
        Stream(
            sse(status_event("loaded"), done=False), after=("POST", "/models/load"), hold_open=True
        ),
    )
    await adapter.load(LoadTarget(GEMMA), lambda f: None)


async def test_a_full_router_is_busy_not_a_failed_load(server, adapter):
    """At --models-max with every model busy, b11434 answers a load with a 500 that says to
    try again later (`server-models.cpp`): busy, so the load is asked again, not given up."""
    server.on("GET", "/v1/models", router({"value": "unloaded", "args": ARGS}, {}))
    full = {"code": 500, "message": "model limit reached, try again later", "type": "server_error"}
    server.on("POST", "/models/load", Reply(500, {"error": full}))
    server.on("GET", "/models/sse", Stream(sse(done=False), hold_open=True))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget(GEMMA), lambda f: None)
    assert raised.value.code == ErrorCode.BUSY
    assert raised.value.message == "model limit reached, try again later"


async def test_router_load_of_an_unknown_model(server, adapter):
    server.on("GET", "/v1/models", router({"value": "unloaded"}, {}))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("nope"), lambda f: None)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_router_unload_waits_for_the_child_to_exit(server, adapter):
    """The call returns at once; the child's `unloaded` event says when it is gone. First,
    its slots are asked for a prompt to save (none here: see test_llamacpp_slots.py)."""
    server.on("GET", "/v1/models", router({"value": "loaded", "args": ARGS}, {}))
    server.on("GET", "/slots", Reply(200, [{"id": 0, "n_ctx": 4096}]))
    server.on("POST", "/models/unload", Reply(200, {"success": True}))
    events = [status_event("unloaded", exit_code=0)]
    server.on(
        "GET",
        "/models/sse",
        Stream(sse(*events, done=False), after=("POST", "/models/unload"), hold_open=True),
    )
    await adapter.unload("gemma")
    assert server.body_of("POST", "/models/unload") == {"model": GEMMA}
    assert server.calls() == [
        ("GET", "/v1/models"),
        ("GET", "/slots"),
        ("GET", "/models/sse"),
        ("POST", "/models/unload"),
        ("GET", "/v1/models"),
    ]


async def test_router_unload_of_a_loading_model_stops_its_load(server, adapter):
    """As the real router does: the unload of a model still `loading` returns at once, and
    within about 0.1 s it is `unloaded` with `failed: true` and exit code 1, as a failed
    load would be. For a stop we asked for, that is plain `unloaded` (no failed load)."""
    assert adapter.stops_loads
    loading = router({"value": "loading", "args": ARGS}, {})
    stopped = router({"value": "unloaded", "args": ARGS, "failed": True, "exit_code": 1}, {})
    server.on("GET", "/v1/models", loading, loading, stopped)
    server.on("POST", "/models/unload", Reply(200, {"success": True}))
    events = [status_event("unloaded", exit_code=1)]
    server.on(
        "GET",
        "/models/sse",
        Stream(sse(*events, done=False), after=("POST", "/models/unload"), hold_open=True),
    )
    await adapter.unload("gemma")
    assert server.body_of("POST", "/models/unload") == {"model": GEMMA}
    assert [(m.id, m.state) for m in await adapter.list_models()] == [
        (GEMMA, "unloaded"),
        ("nomic", "unloaded"),
    ]


async def test_router_unload_of_a_model_not_running_is_done(server, adapter):
    server.on("GET", "/v1/models", router({"value": "unloaded", "args": ARGS}, {}))
    error = {
        "error": {"code": 400, "message": "model is not running", "type": "invalid_request_error"}
    }
    server.on("POST", "/models/unload", Reply(400, error))
    server.on("GET", "/models/sse", Stream([], hold_open=True))
    await adapter.unload(GEMMA)


async def test_router_inference_never_autoloads(server, adapter):
    server.on("GET", "/v1/models", router({"value": "unloaded", "args": ARGS}, {}))
    error = {
        "error": {"code": 400, "message": "model is not loaded", "type": "invalid_request_error"}
    }
    server.on("POST", "/v1/chat/completions", Reply(400, error))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", GEMMA, CHAT))
    assert raised.value.code == ErrorCode.NOT_LOADED
    sent = server.requests_to("POST", "/v1/chat/completions")[0]
    assert sent.query == {"autoload": ["false"]}
    assert sent.body == {**CHAT, "model": GEMMA, "stream": False}
    assert sent.headers["Authorization"] == "Bearer sk-local"


async def test_router_streamed_chat_with_usage_on_the_finish_chunk(server, adapter):
    """Older builds put usage on the finish chunk: the adapter still ends with a usage chunk."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": GEMMA}
    usage = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage},
    ]
    server.on("GET", "/v1/models", router({"value": "loaded", "args": ARGS}, {}))
    server.on("POST", "/v1/chat/completions", Stream([": ping\n\n", *sse(*chunks)]))
    payload = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    out = [c async for c in adapter.stream(InferenceCall("chat", GEMMA, payload, True))]
    assert out[:2] == chunks
    assert out[2] == {**head, "choices": [], "usage": usage}


async def test_mid_stream_error_without_done(server, adapter):
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": GEMMA}
    first = {**head, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    error = {"error": {"code": 500, "message": "failed to decode", "type": "server_error"}}
    server.on("GET", "/v1/models", router({"value": "loaded"}, {}))
    server.on("POST", "/v1/completions", Stream(sse(first, error, done=False)))
    call = InferenceCall("completion", GEMMA, {"prompt": "x", "stream": True}, True)
    with pytest.raises(AdapterError) as raised:
        async for _ in adapter.stream(call):
            pass
    assert (raised.value.code, raised.value.message) == (ErrorCode.SERVER_ERROR, "failed to decode")


async def test_embeddings(server, adapter):
    answer = {"object": "list", "data": [{"object": "embedding", "embedding": [0.5], "index": 0}]}
    server.on("GET", "/v1/models", router({"value": "loaded"}, {"value": "loaded"}))
    server.on("POST", "/v1/embeddings", Reply(200, answer))
    call = InferenceCall("embedding", "nomic", {"model": "e", "input": "x"})
    assert await adapter.run(call) == answer
    assert server.body_of("POST", "/v1/embeddings") == {"model": "nomic", "input": "x"}


async def test_health_is_up_while_loading(server, adapter):
    server.on("GET", "/health", LOADING)
    await adapter.health()


async def test_router_load_started_elsewhere_that_ended_before_the_stream_opened(server, adapter):
    """The event stream tells only what happens after it opened: the listing settles it."""
    server.on(
        "GET",
        "/v1/models",
        router({"value": "loading", "args": ARGS}, {}),
        router({"value": "loaded", "args": ARGS}, {}),
    )
    server.on("GET", "/models/sse", Stream([], hold_open=True))
    seen: list[float] = []
    await adapter.load(LoadTarget(GEMMA), seen.append)
    assert seen == [1.0]
    assert ("POST", "/models/load") not in server.calls()


async def test_router_lists_embedding_and_reranking_presets_and_sizes(server, adapter):
    """A preset's `embeddings = true` or `reranking = true` reaches its args (as b11434
    lists them) and makes the model's type."""
    embed_args = ["llama-server", "--embeddings", "--alias", "nomic"]
    rerank_args = ["llama-server", "--port", "0", "--reranking", "--alias", "bge"]
    data = [
        {"id": GEMMA, "status": {"value": "loaded", "args": ARGS}, "meta": {"size": 96534528}},
        {"id": "nomic", "status": {"value": "unloaded", "args": embed_args}},
        {"id": "bge", "status": {"value": "unloaded", "args": rerank_args}},
    ]
    server.on("GET", "/v1/models", Reply(200, {"object": "list", "data": data}))
    listed = await adapter.list_models()
    assert [(m.id, m.type, m.size_mb) for m in listed] == [
        (GEMMA, "llm", 92),
        ("nomic", "embedding", None),
        ("bge", "reranking", None),
    ]


async def test_single_mode_listing_while_its_model_loads(server, adapter):
    """b11434 answers 503 "Loading model" on every route while loading, /v1/models too."""
    model_id = SINGLE["data"][0]["id"]
    server.on("GET", "/v1/models", Reply(200, SINGLE), LOADING)
    server.on("GET", "/health", Reply(200, {"status": "ok"}), LOADING)
    server.on("GET", "/props", Reply(200, {"is_sleeping": False}))
    assert [m.state for m in await adapter.list_models()] == ["loaded"]
    assert [(m.id, m.state) for m in await adapter.list_models()] == [(model_id, "loading")]


async def test_single_mode_load_while_even_the_listing_says_loading(server, adapter):
    server.on("GET", "/v1/models", LOADING, Reply(200, SINGLE))
    server.on("GET", "/health", LOADING, Reply(200, {"status": "ok"}))
    server.on("GET", "/props", Reply(200, {"is_sleeping": False}))
    await adapter.load(LoadTarget(SINGLE["data"][0]["id"]), lambda f: None)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_router_child_gone_before_the_call_is_not_loaded(server, adapter, streamed):
    """The router reaches no child (it stopped it to make room, behind Switchyard's back): a
    500 with a bare `proxy error` line. The model is not loaded there; the server is fine, so
    no strike against it (three opened its breaker, for every model on the router)."""
    server.on("GET", "/v1/models", router({"value": "loaded"}, {}))
    gone = Reply(500, "proxy error: Could not establish connection")
    server.on("POST", "/v1/chat/completions", gone)
    call = InferenceCall("chat", GEMMA, {**CHAT, "stream": streamed}, streamed)
    with pytest.raises(AdapterError) as raised:
        if streamed:
            async for _ in adapter.stream(call):
                pass
        else:
            await adapter.run(call)
    assert raised.value.code == ErrorCode.NOT_LOADED and not raised.value.server_fault
    assert raised.value.message == "proxy error: Could not establish connection"


async def test_router_stream_cut_by_an_unload_says_what_the_router_said(server, adapter):
    """Unloaded mid-stream, the router ends the 200 stream with a bare text line after the
    child's stop-timeout: no `data:`, no [DONE]."""
    head = {"id": "c", "object": "text_completion", "created": 1, "model": GEMMA}
    first = {**head, "choices": [{"index": 0, "text": " vepo", "finish_reason": None}]}
    pieces = [*sse(first, done=False), "proxy error: Failed to read connection"]
    server.on("GET", "/v1/models", router({"value": "loaded"}, {}))
    server.on("POST", "/v1/completions", Stream(pieces))
    call = InferenceCall("completion", GEMMA, {"prompt": "x", "stream": True}, True)
    got = []
    with pytest.raises(AdapterError) as raised:
        async for chunk in adapter.stream(call):
            got.append(chunk)
    assert got == [first]
    assert raised.value.code == ErrorCode.CONNECTION
    assert "proxy error: Failed to read connection" in raised.value.message


async def test_embeddings_on_a_server_started_without_them(server, adapter):
    """501 `not_supported_error`: the request is wrong for this server, never retried."""
    error = {
        "error": {
            "code": 501,
            "message": "This server does not support embeddings. Start it with `--embeddings`",
            "type": "not_supported_error",
        }
    }
    server.on("GET", "/v1/models", Reply(200, SINGLE))
    server.on("POST", "/v1/embeddings", Reply(501, error))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("embedding", "m", {"input": "x"}))
    assert raised.value.code == ErrorCode.BAD_REQUEST
    assert not raised.value.retryable and not raised.value.server_fault

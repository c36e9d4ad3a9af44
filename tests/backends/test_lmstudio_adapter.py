"""LM Studio adapter against a replay of LM Studio's documented REST API (§2)."""

from collections.abc import Callable
from functools import partial

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.lmstudio import LMStudioAdapter
from backends.adapters.registry import adapter_for
from backends.models import Server
from tests.support.replay_server import Reply, Stream, sse

GEMMA = {
    "type": "llm",
    "publisher": "google",
    "key": "google/gemma-4-26b-a4b",
    "display_name": "Gemma 4 26B A4B",
    "size_bytes": 17990911801,
    "loaded_instances": [{"id": "google/gemma-4-26b-a4b", "config": {"context_length": 4096}}],
    "max_context_length": 262144,
    "format": "gguf",
}
NOMIC = {
    "type": "embedding",
    "publisher": "gaianet",
    "key": "text-embedding-nomic-embed-text-v1.5-embedding",
    "size_bytes": 274290560,
    "loaded_instances": [],
    "max_context_length": 2048,
    "format": "gguf",
}
NOT_LOADED_GEMMA = {**GEMMA, "loaded_instances": []}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "model": "gemma"}
MANUAL_LOADED = {
    "type": "llm",
    "instance_id": "google/gemma-4-26b-a4b",
    "load_time_seconds": 9.099,
    "status": "loaded",
}


@pytest.fixture
def make_adapter() -> Callable[[str], LMStudioAdapter]:
    return partial(LMStudioAdapter, api_key="lm-token")


def listing(*models):
    return Reply(200, {"models": list(models)})


def chat_stream(*events: dict) -> Stream:
    """The native chat's SSE: named events, the name repeated as `type`, no `[DONE]`."""
    return Stream(sse(*events, done=False, named=[e["type"] for e in events]))


GEMMA_ID = GEMMA["key"]
LOADING_CHAT = [
    {"type": "chat.start", "model_instance_id": GEMMA_ID},
    {"type": "model_load.start", "model_instance_id": GEMMA_ID},
    {"type": "model_load.progress", "model_instance_id": GEMMA_ID, "progress": 0.25},
    {"type": "model_load.progress", "model_instance_id": GEMMA_ID, "progress": 0.65},
    {"type": "model_load.end", "model_instance_id": GEMMA_ID, "load_time_seconds": 12.34},
    {"type": "prompt_processing.start"},
    {"type": "prompt_processing.progress", "progress": 0.5},
    {"type": "prompt_processing.end"},
    {"type": "message.start"},
    {"type": "message.delta", "content": "The"},
    {"type": "message.end"},
]


async def loads_with_progress(adapter, target: LoadTarget) -> list[float]:
    seen: list[float] = []
    await adapter.load(target, seen.append)
    return seen


async def test_lists_models_with_state_type_and_size(server, adapter):
    server.on("GET", "/api/v1/models", listing(GEMMA, NOMIC))
    models = await adapter.list_models()
    assert [(m.id, m.state, m.type, m.size_mb) for m in models] == [
        ("google/gemma-4-26b-a4b", "loaded", "llm", 17157),
        ("text-embedding-nomic-embed-text-v1.5-embedding", "unloaded", "embedding", 261),
    ]
    assert server.seen[0].headers["Authorization"] == "Bearer lm-token"


async def test_a_loaded_llm_lists_the_predictions_it_runs_at_once_and_its_context(server, adapter):
    """`parallel` in a loaded instance's config (`lms load --parallel 4`, LM Studio 0.4's
    continuous batching): discovery fills the deployment's empty slots with it. Its
    context is the one it was loaded with, not the weights' `max_context_length`; a model
    not loaded says none."""
    instance = {"id": GEMMA_ID, "config": {"context_length": 4096, "parallel": 4}}
    server.on("GET", "/api/v1/models", listing({**GEMMA, "loaded_instances": [instance]}, NOMIC))
    listed = await adapter.list_models()
    assert [(m.slots, m.context_length) for m in listed] == [(4, 4096), (None, None)]


async def test_the_listing_says_what_an_llm_takes_besides_text(server, adapter):
    """LM Studio 0.4's `capabilities` (vision, tool use, reasoning): discovery fills a
    model's unknown capabilities with them. An embedding model has none to say."""
    said = {"vision": True, "trained_for_tool_use": True, "reasoning": {"default": "on"}}
    plain = {"vision": False, "trained_for_tool_use": False}
    gemma, plain = {**GEMMA, "capabilities": said}, {**GEMMA, "key": "p", "capabilities": plain}
    server.on("GET", "/api/v1/models", listing(gemma, plain, NOMIC))
    assert [m.capabilities for m in await adapter.list_models()] == [
        ("tools", "vision", "thinking"),
        (),
        None,
    ]


async def test_falls_back_to_the_v0_listing_on_older_servers(server, adapter):
    server.on("GET", "/api/v1/models", Reply(200, "Unexpected endpoint or method."))
    server.on(
        "GET",
        "/api/v0/models",
        Reply(
            200,
            {
                "object": "list",
                "data": [
                    {"id": "meta-llama-3.1-8b-instruct", "type": "llm", "state": "not-loaded"},
                    {
                        "id": "qwen2-vl-7b-instruct",
                        "type": "vlm",
                        "state": "loaded",
                        "capabilities": ["tool_use"],
                        "max_context_length": 32768,
                        "loaded_context_length": 8192,
                    },
                    {"id": "nomic", "type": "embeddings", "state": "not-loaded"},
                ],
            },
        ),
    )
    models = await adapter.list_models()
    # Images by the type vlm, tools by `capabilities` (0.3.16+); an entry with neither
    # says nothing of what it takes.
    assert [(m.id, m.state, m.type, m.capabilities, m.context_length) for m in models] == [
        ("meta-llama-3.1-8b-instruct", "unloaded", "llm", None, None),
        ("qwen2-vl-7b-instruct", "loaded", "llm", ("tools", "vision"), 8192),
        ("nomic", "unloaded", "embedding", None, None),
    ]


async def test_an_llm_loads_through_a_chat_stream_whose_progress_is_passed_on(server, adapter):
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/chat", chat_stream(*LOADING_CHAT))
    target = LoadTarget(GEMMA_ID, options={"context_length": 16384, "load_seconds": 3})
    assert await loads_with_progress(adapter, target) == [0.25, 0.65, 1.0]
    assert server.calls() == [("GET", "/api/v1/models"), ("POST", "/api/v1/chat")]
    assert server.body_of("POST", "/api/v1/chat") == {
        "model": GEMMA_ID,
        "input": "Hi",
        "max_output_tokens": 1,
        "stream": True,
        "store": False,
        "context_length": 16384,
    }


async def test_a_load_error_event_in_the_chat_stream_is_a_load_failure(server, adapter):
    message = (
        "Model loading was stopped due to insufficient system resources. Under the current "
        "settings, this model requires approximately 18 GB of memory."
    )
    error = {"type": "error", "error": {"type": "unknown", "message": message}}
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/chat", chat_stream(LOADING_CHAT[0], LOADING_CHAT[1], error))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget(GEMMA_ID), lambda fraction: None)
    assert raised.value.code == ErrorCode.LOAD_FAILED
    assert raised.value.message == message


async def test_a_model_not_found_event_in_the_chat_stream_is_not_found(server, adapter):
    error = {"type": "error", "error": {"type": "model_not_found", "message": "gone"}}
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/chat", chat_stream(error))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget(GEMMA_ID), lambda fraction: None)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_a_chat_that_finds_the_model_loaded_meanwhile_loads_nothing_more(server, adapter):
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA), listing(GEMMA))
    server.on("POST", "/api/v1/chat", chat_stream(LOADING_CHAT[0], *LOADING_CHAT[5:]))
    assert await loads_with_progress(adapter, LoadTarget(GEMMA_ID)) == []
    assert server.calls() == [
        ("GET", "/api/v1/models"),
        ("POST", "/api/v1/chat"),
        ("GET", "/api/v1/models"),
    ]


async def test_with_jit_loading_off_the_refused_chat_falls_back_to_a_manual_load(server, adapter):
    refusal = {
        "error": {
            "message": "No models loaded. Please load a model in the developer page or use "
            "the 'lms load' command.",
            "type": "invalid_request_error",
            "param": "model",
            "code": None,
        }
    }
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/chat", Reply(400, refusal))
    server.on("POST", "/api/v1/models/load", Reply(200, MANUAL_LOADED))
    await adapter.load(LoadTarget(GEMMA_ID), lambda fraction: None)
    assert server.calls()[1:] == [("POST", "/api/v1/chat"), ("POST", "/api/v1/models/load")]


async def test_engine_options_need_the_manual_load_endpoint(server, adapter):
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/models/load", Reply(200, MANUAL_LOADED))
    target = LoadTarget(
        GEMMA_ID,
        options={"context_length": 16384, "flash_attention": True, "load_seconds": 3},
    )
    await adapter.load(target, lambda fraction: None)
    assert server.calls() == [("GET", "/api/v1/models"), ("POST", "/api/v1/models/load")]
    assert server.body_of("POST", "/api/v1/models/load") == {
        "model": GEMMA_ID,
        "context_length": 16384,
        "flash_attention": True,
    }


async def test_a_server_holding_several_llms_loads_manually_so_jit_evicts_nothing(server):
    """A chat load is a JIT load, and LM Studio keeps one JIT model at a time."""
    row = Server(kind="lmstudio", base_url=server.url, max_llm=2)
    adapter = adapter_for(row)
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/models/load", Reply(200, MANUAL_LOADED))
    try:
        await adapter.load(LoadTarget(GEMMA_ID), lambda fraction: None)
    finally:
        await adapter.close()
    assert server.calls() == [("GET", "/api/v1/models"), ("POST", "/api/v1/models/load")]


@pytest.mark.parametrize(
    ("via", "path"), [("manual", "/api/v1/models/load"), ("chat", "/api/v1/chat")]
)
async def test_the_load_via_option_chooses_the_endpoint(server, adapter_on, via, path):
    adapter = adapter_on(server.url)
    adapter.single_llm = via == "manual"  # the opposite of what the option asks for
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/models/load", Reply(200, MANUAL_LOADED))
    server.on("POST", "/api/v1/chat", chat_stream(*LOADING_CHAT))
    await adapter.load(LoadTarget(GEMMA_ID, options={"load_via": via}), lambda fraction: None)
    assert server.calls()[1:] == [("POST", path)]


async def test_load_of_an_embedding_model_sends_only_the_context_length(server, adapter):
    server.on("GET", "/api/v1/models", listing(NOMIC))
    server.on("POST", "/api/v1/models/load", Reply(200, {"type": "embedding", "status": "loaded"}))
    target = LoadTarget(NOMIC["key"], "embedding", {"context_length": 2048, "num_experts": 4})
    await adapter.load(target, lambda fraction: None)
    assert server.body_of("POST", "/api/v1/models/load") == {
        "model": NOMIC["key"],
        "context_length": 2048,
    }


async def test_load_of_a_loaded_model_does_not_start_a_second_instance(server, adapter):
    server.on("GET", "/api/v1/models", listing(GEMMA))
    await adapter.load(LoadTarget("google/gemma-4-26b-a4b"), lambda fraction: None)
    assert server.calls() == [("GET", "/api/v1/models")]


async def test_load_of_an_unknown_model_is_not_found(server, adapter):
    server.on("GET", "/api/v1/models", listing(GEMMA))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("nope"), lambda fraction: None)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_a_guardrail_refusal_is_a_load_failure_despite_its_404(server, adapter):
    message = (
        'Failed to load model "gemma". Error: Model loading aborted due to insufficient '
        "system resources."
    )
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    server.on("POST", "/api/v1/models/load", Reply(404, {"error": {"message": message}}))
    target = LoadTarget(GEMMA_ID, options={"load_via": "manual"})
    with pytest.raises(AdapterError) as raised:
        await adapter.load(target, lambda fraction: None)
    assert raised.value.code == ErrorCode.LOAD_FAILED
    assert raised.value.message == message


async def test_unload_unloads_every_instance_by_instance_id(server, adapter):
    two = {**GEMMA, "loaded_instances": [{"id": "google/gemma-4-26b-a4b"}, {"id": "gemma:2"}]}
    server.on("GET", "/api/v1/models", listing(two))
    server.on("POST", "/api/v1/models/unload", Reply(200, {"instance_id": "x"}))
    await adapter.unload("google/gemma-4-26b-a4b")
    assert [s.body for s in server.requests_to("POST", "/api/v1/models/unload")] == [
        {"instance_id": "google/gemma-4-26b-a4b"},
        {"instance_id": "gemma:2"},
    ]


async def test_unload_of_an_unloaded_model_sends_nothing(server, adapter):
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    await adapter.unload("google/gemma-4-26b-a4b")
    assert server.calls() == [("GET", "/api/v1/models")]


async def test_chat_runs_on_the_openai_route(server, adapter):
    answer = {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1731990317,
        "model": "google/gemma-4-26b-a4b",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 24, "completion_tokens": 3, "total_tokens": 27},
    }
    server.on("GET", "/api/v1/models", listing(GEMMA))
    server.on("POST", "/v1/chat/completions", Reply(200, answer))
    result = await adapter.run(InferenceCall("chat", "google/gemma-4-26b-a4b", CHAT))
    assert result == answer
    assert server.body_of("POST", "/v1/chat/completions") == {
        **CHAT,
        "model": "google/gemma-4-26b-a4b",
        "stream": False,
    }


async def test_inference_on_an_unloaded_model_never_reaches_the_server(server, adapter):
    server.on("GET", "/api/v1/models", listing(NOT_LOADED_GEMMA))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "google/gemma-4-26b-a4b", CHAT))
    assert raised.value.code == ErrorCode.NOT_LOADED
    assert ("POST", "/v1/chat/completions") not in server.calls()


async def test_streamed_chat_ends_with_the_usage_chunk(server, adapter):
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}},
    ]
    server.on("GET", "/api/v1/models", listing(GEMMA))
    server.on("POST", "/v1/chat/completions", Stream(sse(*chunks)))
    payload = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    call = InferenceCall("chat", "google/gemma-4-26b-a4b", payload, stream=True)
    assert [c async for c in adapter.stream(call)] == chunks
    sent = server.body_of("POST", "/v1/chat/completions")
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_model_not_found_on_inference(server, adapter):
    error = {
        "error": {
            "message": 'Model "default" not found. Please specify a valid model.',
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    server.on("GET", "/api/v1/models", listing(GEMMA))
    server.on("POST", "/v1/chat/completions", Reply(404, error))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "google/gemma-4-26b-a4b", CHAT))
    assert raised.value.code == ErrorCode.NOT_FOUND
    assert raised.value.message.startswith('Model "default" not found')


async def test_no_models_loaded_answer_is_not_loaded(server, adapter):
    message = "No models loaded. Please load a model in the developer page or use 'lms load'."
    server.on("GET", "/api/v1/models", listing(GEMMA))
    server.on("POST", "/v1/completions", Reply(400, {"error": {"message": message}}))
    call = InferenceCall("completion", "google/gemma-4-26b-a4b", {"prompt": "x"})
    with pytest.raises(AdapterError) as raised:
        await adapter.run(call)
    assert raised.value.code == ErrorCode.NOT_LOADED


async def test_health_probes_the_greeting(server, adapter):
    server.on("GET", "/lmstudio-greeting", Reply(200, {"lmstudio": True}))
    await adapter.health()


async def test_health_of_a_stopped_server_is_a_connection_error(server, adapter):
    server.close()
    with pytest.raises(AdapterError) as raised:
        await adapter.health()
    assert raised.value.code == ErrorCode.CONNECTION


async def test_a_rerank_is_refused_without_a_call(server, adapter):
    """LM Studio's API has no rerank: refused as a bad request, nothing sent."""
    call = InferenceCall(kind="rerank", server_model_id="m", payload={"query": "q"})
    with pytest.raises(AdapterError) as err:
        await adapter.run(call)
    assert err.value.code == ErrorCode.BAD_REQUEST
    assert not [c for c in server.calls() if c[1] == "/v1/rerank"]


@pytest.mark.parametrize(
    "kind, path, payload",
    [
        ("response", "/v1/responses", {"input": "hi"}),
        ("message", "/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
async def test_responses_and_anthropic_messages_go_to_lm_studios_own_routes(
    server, adapter, kind, path, payload
):
    server.on("GET", "/api/v1/models", listing(GEMMA))
    server.on("POST", path, Reply(200, {"id": "x"}))
    assert await adapter.run(InferenceCall(kind, "google/gemma-4-26b-a4b", payload)) == {"id": "x"}
    assert server.body_of("POST", path) == {
        **payload,
        "model": "google/gemma-4-26b-a4b",
        "stream": False,
    }

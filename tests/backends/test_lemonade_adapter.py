"""Lemonade adapter against a replay of Lemonade Server's API (§7)."""

from collections.abc import Callable

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.lemonade import LemonadeAdapter
from tests.support.replay_server import Reply, Stream, sse

QWEN = "Qwen3-0.6B-GGUF"
MODELS = Reply(
    200,
    {
        "object": "list",
        "data": [
            {
                "id": QWEN,
                "object": "model",
                "recipe": "llamacpp",
                "labels": ["reasoning"],
                "size": 0.38,
            },
            {
                "id": "nomic-embed-text-v1-GGUF",
                "object": "model",
                "labels": ["embeddings"],
                "size": 0.08,
            },
        ],
    },
)
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


def health(*loaded: str) -> Reply:
    return Reply(
        200,
        {
            "status": "ok",
            "model_loaded": loaded[0] if loaded else None,
            "all_models_loaded": [{"model_name": name, "type": "llm"} for name in loaded],
        },
    )


def model_error(status: int, message: str, code: str) -> Reply:
    return Reply(
        status,
        {
            "error": {
                "message": message,
                "type": code,
                "param": "model",
                "code": code,
                "requested_model": QWEN,
            }
        },
    )


@pytest.fixture
def make_adapter() -> Callable[[str], LemonadeAdapter]:
    return LemonadeAdapter


async def test_lists_downloaded_models_with_the_loaded_ones(server, adapter):
    server.on("GET", "/api/v1/models", MODELS)
    server.on("GET", "/api/v1/health", health(QWEN))
    assert [(m.id, m.state, m.type, m.size_mb) for m in await adapter.list_models()] == [
        (QWEN, "loaded", "llm", 389),
        ("nomic-embed-text-v1-GGUF", "unloaded", "embedding", 81),
    ]


async def test_load_sends_the_recipe_options(server, adapter):
    answer = {"status": "success", "model_name": QWEN, "checkpoint": "x", "recipe": "llamacpp"}
    server.on("POST", "/api/v1/load", Reply(200, answer))
    options = {"context_length": 8192, "llamacpp_backend": "vulkan", "load_seconds": 1}
    await adapter.load(LoadTarget(QWEN, options=options), lambda f: None)
    assert server.body_of("POST", "/api/v1/load") == {
        "model_name": QWEN,
        "ctx_size": 8192,
        "llamacpp_backend": "vulkan",
    }


async def test_a_model_is_loading_while_its_load_call_runs(server, adapter):
    """The listing has no loading state; the adapter knows its own loads."""
    server.on("GET", "/api/v1/models", MODELS)
    server.on("GET", "/api/v1/health", health())
    adapter.loading.add(QWEN)
    assert (await adapter.list_models())[0].state == "loading"


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (
            model_error(404, f"Model '{QWEN}' was not found.", "model_not_found"),
            ErrorCode.NOT_FOUND,
        ),
        (
            model_error(500, f"Failed to load model '{QWEN}': out of memory", "model_load_error"),
            ErrorCode.LOAD_FAILED,
        ),
        (model_error(409, "All slots are pinned", "slots_pinned_error"), ErrorCode.LOAD_FAILED),
    ],
    ids=["unknown", "load-error", "pinned"],
)
async def test_load_errors(server, adapter, reply, code):
    server.on("POST", "/api/v1/load", reply)
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget(QWEN), lambda f: None)
    assert raised.value.code == code
    assert raised.value.message == reply.body["error"]["message"]


async def test_unload(server, adapter):
    answer = {"status": "success", "message": "Model unloaded successfully", "model_name": QWEN}
    server.on("POST", "/api/v1/unload", Reply(200, answer))
    await adapter.unload(QWEN)
    assert server.body_of("POST", "/api/v1/unload") == {"model_name": QWEN}


async def test_unload_of_a_model_not_loaded_is_done(server, adapter):
    server.on("POST", "/api/v1/unload", Reply(404, {"error": f"Model {QWEN} is not loaded"}))
    await adapter.unload(QWEN)


async def test_inference_on_an_unloaded_model_is_refused_before_sending(server, adapter):
    server.on("GET", "/api/v1/health", health())
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", QWEN, CHAT))
    assert raised.value.code == ErrorCode.NOT_LOADED
    assert server.calls() == [("GET", "/api/v1/health")]


async def test_chat_stream_and_embeddings(server, adapter):
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": QWEN}
    chunk = {**head, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    embedding = {
        "object": "list",
        "data": [{"object": "embedding", "embedding": [1.0], "index": 0}],
    }
    server.on("GET", "/api/v1/health", health(QWEN, "nomic"))
    server.on("POST", "/api/v1/chat/completions", Stream(sse(chunk)))
    server.on("POST", "/api/v1/embeddings", Reply(200, embedding))
    call = InferenceCall("chat", QWEN, {**CHAT, "stream": True}, stream=True)
    assert [c async for c in adapter.stream(call)] == [chunk]
    assert await adapter.run(InferenceCall("embedding", "nomic", {"input": ["a"]})) == embedding
    assert server.body_of("POST", "/api/v1/embeddings") == {"input": ["a"], "model": "nomic"}


async def test_health(server, adapter):
    server.on("GET", "/live", Reply(200, {"status": "ok"}))
    await adapter.health()

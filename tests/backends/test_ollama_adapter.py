"""Ollama adapter against a replay of Ollama's native API (§3): NDJSON in, OpenAI out."""

import time
from collections.abc import Callable

import pytest

from backends import responses_api
from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.ollama import OllamaAdapter
from tests.support.replay_server import Reply, Stream, ndjson

TAGS = {
    "models": [
        {"name": "llama3.2:latest", "model": "llama3.2:latest", "size": 2019393189},
        {
            "name": "all-minilm:latest",
            "model": "all-minilm:latest",
            "size": 45960996,
            "capabilities": ["embedding"],
        },
    ]
}
PS_LLAMA = {"models": [{"name": "llama3.2:latest", "model": "llama3.2:latest", "size_vram": 1}]}
PS_NONE = {"models": []}
LOAD_OPTIONS = {"context_length": 8192, "options": {"num_gpu": 99}}
CHAT = {
    "model": "llama",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0.2,
    "max_tokens": 5,
}
FINAL = {
    "model": "llama3.2",
    "created_at": "2023-08-04T19:22:45.499127Z",
    "message": {"role": "assistant", "content": ""},
    "done": True,
    "done_reason": "stop",
    "total_duration": 4883583458,
    "prompt_eval_count": 26,
    "eval_count": 2,
}


@pytest.fixture
def make_adapter() -> Callable[[str], OllamaAdapter]:
    return OllamaAdapter


async def test_lists_installed_models_with_the_loaded_ones(server, adapter):
    """A loaded model's context is the one `/api/ps` says it runs with (newer servers say
    it); a model not loaded has none yet (its context is `num_ctx` at each load)."""
    server.on("GET", "/api/tags", Reply(200, TAGS))
    ps = {"models": [{**PS_LLAMA["models"][0], "context_length": 8192}]}
    server.on("GET", "/api/ps", Reply(200, PS_LLAMA), Reply(200, ps))
    models = await adapter.list_models()
    assert [(m.id, m.state, m.type, m.size_mb, m.context_length) for m in models] == [
        ("llama3.2:latest", "loaded", "llm", 1925, None),
        ("all-minilm:latest", "unloaded", "embedding", 43, None),
    ]
    assert [m.context_length for m in await adapter.list_models()] == [8192, None]


async def test_the_listing_says_what_a_model_takes_where_the_server_says_it(server, adapter):
    """Ollama 0.7+ lists `capabilities`; an older listing (llama3.2 here) says nothing."""
    gemma = {"name": "gemma3:4b", "size": 1, "capabilities": ["completion", "vision", "tools"]}
    server.on("GET", "/api/tags", Reply(200, {"models": [*TAGS["models"], gemma]}))
    server.on("GET", "/api/ps", Reply(200, PS_NONE))
    assert [m.capabilities for m in await adapter.list_models()] == [
        None,
        (),
        ("tools", "vision"),
    ]


async def test_load_keeps_the_model_until_unloaded_with_its_options(server, adapter):
    server.on(
        "POST",
        "/api/generate",
        Reply(200, {"model": "llama3.2", "response": "", "done": True, "done_reason": "load"}),
    )
    await adapter.load(LoadTarget("llama3.2", options=LOAD_OPTIONS), lambda f: None)
    assert server.body_of("POST", "/api/generate") == {
        "model": "llama3.2",
        "keep_alive": -1,
        "options": {"num_gpu": 99, "num_ctx": 8192},
    }
    # The listing reports the model under the name the deployment uses.
    server.on("GET", "/api/tags", Reply(200, TAGS))
    server.on("GET", "/api/ps", Reply(200, PS_LLAMA))
    assert (await adapter.list_models())[0].id == "llama3.2"


async def test_load_of_an_embedding_model_uses_an_empty_embed(server, adapter):
    server.on("POST", "/api/embed", Reply(200, {"model": "all-minilm", "embeddings": []}))
    await adapter.load(LoadTarget("all-minilm", "embedding"), lambda f: None)
    assert server.body_of("POST", "/api/embed") == {
        "model": "all-minilm",
        "keep_alive": -1,
        "input": [],
    }


async def test_out_of_memory_is_a_load_failure(server, adapter):
    message = "model requires more system memory (12 GiB) than is available: out of memory"
    server.on("POST", "/api/generate", Reply(500, {"error": message}))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("llama3.2"), lambda f: None)
    assert (raised.value.code, raised.value.message) == (ErrorCode.LOAD_FAILED, message)


async def test_any_500_on_load_is_a_load_failure(server, adapter):
    server.on("POST", "/api/generate", Reply(500, {"error": "llama runner process has terminated"}))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("llama3.2"), lambda f: None)
    assert raised.value.code == ErrorCode.LOAD_FAILED


async def test_load_of_a_missing_model_is_not_found(server, adapter):
    server.on("POST", "/api/generate", Reply(404, {"error": "model 'nope' not found"}))
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("nope"), lambda f: None)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_unload_waits_until_the_model_leaves_ps(server, adapter):
    server.on(
        "POST",
        "/api/generate",
        Reply(200, {"model": "llama3.2", "response": "", "done": True, "done_reason": "unload"}),
    )
    server.on("GET", "/api/ps", Reply(200, PS_LLAMA), Reply(200, PS_LLAMA), Reply(200, PS_NONE))
    await adapter.unload("llama3.2")
    assert server.body_of("POST", "/api/generate") == {"model": "llama3.2", "keep_alive": 0}
    assert server.calls().count(("GET", "/api/ps")) == 3


async def test_unload_follows_the_server_at_once_then_backs_off(server, adapter):
    """Ollama unloads in milliseconds: the first look at /api/ps follows the unload at once
    and the next ones back off from 10 ms, so three looks cost tens of milliseconds. Breaks
    if the adapter waited its full poll interval (0.5 s) between looks (at least 1 s here)."""
    adapter.poll_interval_s = 0.5  # the production interval, not the tests' 0
    server.on(
        "POST",
        "/api/generate",
        Reply(200, {"model": "llama3.2", "response": "", "done": True, "done_reason": "unload"}),
    )
    server.on("GET", "/api/ps", Reply(200, PS_LLAMA), Reply(200, PS_LLAMA), Reply(200, PS_NONE))
    started = time.monotonic()
    await adapter.unload("llama3.2")
    assert server.calls().count(("GET", "/api/ps")) == 3
    assert time.monotonic() - started < 0.9


async def test_chat_is_translated_both_ways(server, adapter):
    answer = {**FINAL, "message": {"role": "assistant", "content": "Hello!"}}
    server.on("POST", "/api/chat", Reply(200, answer))
    call = InferenceCall("chat", "llama3.2", CHAT, load_options=LOAD_OPTIONS)
    result = await adapter.run(call)
    assert server.body_of("POST", "/api/chat") == {
        "model": "llama3.2",
        "keep_alive": -1,
        "stream": False,
        "options": {"num_gpu": 99, "num_ctx": 8192, "temperature": 0.2, "num_predict": 5},
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert result["object"] == "chat.completion"
    assert result["model"] == "llama3.2"
    assert result["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert result["usage"] == {"prompt_tokens": 26, "completion_tokens": 2, "total_tokens": 28}


async def test_tool_calls_go_out_as_objects_and_come_back_as_strings(server, adapter):
    answer = {
        **FINAL,
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
        },
    }
    server.on("POST", "/api/chat", Reply(200, answer))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    result = await adapter.run(
        InferenceCall("chat", "llama3.2", {"messages": messages, "tools": tools})
    )
    sent = server.body_of("POST", "/api/chat")
    assert sent["tools"] == tools
    assert sent["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "weather"},
    ]
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "Oslo"}',
    }


async def test_streamed_chat_becomes_openai_chunks_ending_with_usage(server, adapter):
    lines = ndjson(
        {"model": "llama3.2", "message": {"role": "assistant", "content": "The"}, "done": False},
        {"model": "llama3.2", "message": {"role": "assistant", "content": " sky"}, "done": False},
        FINAL,
    )
    server.on("POST", "/api/chat", Stream(lines, "application/x-ndjson"))
    payload = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    chunks = [c async for c in adapter.stream(InferenceCall("chat", "llama3.2", payload, True))]
    assert server.body_of("POST", "/api/chat")["stream"] is True
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "delta": {"role": "assistant", "content": "The"}, "finish_reason": None}],
        [{"index": 0, "delta": {"content": " sky"}, "finish_reason": None}],
        [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        [],
    ]
    assert chunks[-1]["usage"] == {"prompt_tokens": 26, "completion_tokens": 2, "total_tokens": 28}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1


async def test_a_streamed_completion_ends_with_its_usage_even_unasked(server, adapter):
    """The stored answer counts its tokens (quotas); the relay keeps the usage-only chunk
    from a caller that did not ask for it."""
    lines = ndjson(
        {"model": "llama3.2", "response": "Once", "done": False},
        {"model": "llama3.2", "response": "", "done": True, "done_reason": "length"},
    )
    server.on("POST", "/api/generate", Stream(lines, "application/x-ndjson"))
    call = InferenceCall("completion", "llama3.2", {"prompt": ["Tell"], "stream": True}, True)
    chunks = [c async for c in adapter.stream(call)]
    assert server.body_of("POST", "/api/generate") == {
        "model": "llama3.2",
        "keep_alive": -1,
        "stream": True,
        "prompt": "Tell",
    }
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "text": "Once", "finish_reason": None}],
        [{"index": 0, "text": "", "finish_reason": "length"}],
        [],
    ]
    assert chunks[-1]["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


async def test_mid_stream_error_line_raises_with_its_message(server, adapter):
    lines = ndjson(
        {"model": "llama3.2", "message": {"role": "assistant", "content": "The"}, "done": False},
        {"error": "an error was encountered while running the model: out of memory"},
    )
    server.on("POST", "/api/chat", Stream(lines, "application/x-ndjson"))
    call = InferenceCall("chat", "llama3.2", CHAT, stream=True)
    seen = []
    with pytest.raises(AdapterError) as raised:
        async for chunk in adapter.stream(call):
            seen.append(chunk)
    assert len(seen) == 1
    assert raised.value.message.endswith("out of memory")


async def test_a_stream_cut_short_is_a_lost_connection(server, adapter):
    lines = ndjson({"model": "m", "message": {"role": "assistant", "content": "x"}, "done": False})
    server.on("POST", "/api/chat", Stream(lines, "application/x-ndjson"))
    with pytest.raises(AdapterError) as raised:
        async for _ in adapter.stream(InferenceCall("chat", "llama3.2", CHAT, stream=True)):
            pass
    assert raised.value.code == ErrorCode.CONNECTION


async def test_embeddings_are_translated(server, adapter):
    answer = {"model": "all-minilm", "embeddings": [[0.1, 0.2], [0.3, 0.4]], "prompt_eval_count": 8}
    server.on("POST", "/api/embed", Reply(200, answer))
    call = InferenceCall("embedding", "all-minilm", {"input": ["a", "b"], "model": "e"})
    result = await adapter.run(call)
    assert server.body_of("POST", "/api/embed") == {
        "model": "all-minilm",
        "keep_alive": -1,
        "input": ["a", "b"],
    }
    assert result == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]},
            {"object": "embedding", "index": 1, "embedding": [0.3, 0.4]},
        ],
        "model": "all-minilm",
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    }


async def test_queue_full_is_busy(server, adapter):
    message = "server busy, please try again.  maximum pending requests exceeded"
    server.on("POST", "/api/chat", Reply(503, {"error": message}))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "llama3.2", CHAT))
    assert (raised.value.code, raised.value.message) == (ErrorCode.BUSY, message)


async def test_bad_request_keeps_the_message(server, adapter):
    server.on("POST", "/api/chat", Reply(400, {"error": '"all-minilm" does not support chat'}))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "all-minilm", CHAT))
    assert raised.value.code == ErrorCode.BAD_REQUEST
    assert raised.value.message == '"all-minilm" does not support chat'


async def test_health(server, adapter):
    server.on("GET", "/", Reply(200, "Ollama is running"))
    await adapter.health()


async def test_a_response_goes_through_api_chat_and_comes_back_as_a_response(server, adapter):
    """Ollama's own /v1/responses would reset the model's keep-alive and options: a
    Responses API call is asked as a chat, with both, and its answer turned back."""
    answer = {**FINAL, "message": {"role": "assistant", "content": "Hello!"}}
    server.on("POST", "/api/chat", Reply(200, answer))
    payload = {
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "max_output_tokens": 5,
    }
    result = await adapter.run(
        InferenceCall("response", "llama3.2", payload, load_options=LOAD_OPTIONS)
    )
    assert server.body_of("POST", "/api/chat") == {
        "model": "llama3.2",
        "keep_alive": -1,
        "stream": False,
        "options": {"num_gpu": 99, "num_ctx": 8192, "num_predict": 5},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
    }
    assert (result["object"], result["status"]) == ("response", "completed")
    assert responses_api.output_text(result) == "Hello!"
    assert result["usage"] == {"input_tokens": 26, "output_tokens": 2, "total_tokens": 28}


async def test_a_streamed_response_ends_with_the_response_and_its_usage(server, adapter):
    lines = ndjson(
        {"model": "llama3.2", "message": {"role": "assistant", "content": "The"}, "done": False},
        {"model": "llama3.2", "message": {"role": "assistant", "content": " sky"}, "done": False},
        FINAL,
    )
    server.on("POST", "/api/chat", Stream(lines, "application/x-ndjson"))
    call = InferenceCall("response", "llama3.2", {"input": "hi", "stream": True}, True)
    events = [e async for e in adapter.stream(call)]
    assert server.body_of("POST", "/api/chat")["messages"] == [{"role": "user", "content": "hi"}]
    assert [e["type"] for e in events] == [
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    done = events[-1]["response"]
    assert responses_api.output_text(done) == "The sky"
    assert done["usage"]["output_tokens"] == 2


async def test_a_response_with_tools_is_refused_before_asking(server, adapter):
    call = InferenceCall("response", "llama3.2", {"input": "hi", "tools": [{"type": "x"}]})
    with pytest.raises(AdapterError) as raised:
        await adapter.run(call)
    assert raised.value.code == ErrorCode.BAD_REQUEST and "tools" in raised.value.message
    assert server.calls() == []


async def test_an_anthropic_message_goes_through_api_chat_too(server, adapter):
    answer = {**FINAL, "message": {"role": "assistant", "content": "Hello!"}}
    server.on("POST", "/api/chat", Reply(200, answer))
    payload = {
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 5,
    }
    result = await adapter.run(InferenceCall("message", "llama3.2", payload))
    sent = server.body_of("POST", "/api/chat")
    assert (sent["keep_alive"], sent["options"]) == (-1, {"num_predict": 5})
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert (result["type"], result["stop_reason"]) == ("message", "end_turn")
    assert result["content"] == [{"type": "text", "text": "Hello!"}]
    assert result["usage"] == {"input_tokens": 26, "output_tokens": 2}

    lines = ndjson(
        {"model": "llama3.2", "message": {"role": "assistant", "content": "The"}, "done": False},
        FINAL,
    )
    server.on("POST", "/api/chat", Stream(lines, "application/x-ndjson"))
    call = InferenceCall("message", "llama3.2", {**payload, "stream": True}, True)
    events = [e async for e in adapter.stream(call)]
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2]["delta"] == {"type": "text_delta", "text": "The"}
    assert events[4]["usage"] == {"input_tokens": 26, "output_tokens": 2}

"""vLLM adapter against a replay of vLLM's server with sleep mode (§6)."""

from collections.abc import Callable
from functools import partial

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.vllm import VLLMAdapter
from tests.support.replay_server import Reply, Stream, sse

QWEN = "Qwen/Qwen3-0.6B"
MODELS = Reply(
    200,
    {
        "object": "list",
        "data": [{"id": QWEN, "object": "model", "owned_by": "vllm", "max_model_len": 40960}],
    },
)
ASLEEP, AWAKE = Reply(200, {"is_sleeping": True}), Reply(200, {"is_sleeping": False})
NO_DEV_MODE = Reply(404, {"detail": "Not Found"})
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def make_adapter() -> Callable[[str], VLLMAdapter]:
    return partial(VLLMAdapter, api_key="vllm-key")


async def test_lists_the_served_model_awake_or_sleeping(server, adapter):
    server.on("GET", "/v1/models", MODELS)
    server.on("GET", "/is_sleeping", AWAKE, ASLEEP)
    listed = await adapter.list_models()
    # Its context is the engine's (`--max-model-len`): discovery fills the model's with it.
    assert [(m.id, m.state, m.context_length) for m in listed] == [(QWEN, "loaded", 40960)]
    assert [m.state for m in await adapter.list_models()] == ["sleeping"]


async def test_without_dev_mode_the_model_is_always_loaded(server, adapter):
    server.on("GET", "/v1/models", MODELS)
    server.on("GET", "/is_sleeping", NO_DEV_MODE)
    assert [m.state for m in await adapter.list_models()] == ["loaded"]
    assert [m.state for m in await adapter.list_models()] == ["loaded"]
    assert server.calls().count(("GET", "/is_sleeping")) == 1
    with pytest.raises(AdapterError) as raised:
        await adapter.unload(QWEN)
    assert raised.value.code == ErrorCode.BAD_REQUEST


async def test_load_wakes_it_up_and_waits(server, adapter):
    server.on("GET", "/v1/models", MODELS)
    server.on("GET", "/is_sleeping", ASLEEP, ASLEEP, AWAKE)
    server.on("POST", "/wake_up", Reply(200))
    await adapter.load(LoadTarget(QWEN), lambda f: None)
    assert server.calls() == [
        ("GET", "/v1/models"),
        ("GET", "/is_sleeping"),
        ("POST", "/wake_up"),
        ("GET", "/is_sleeping"),
        ("GET", "/is_sleeping"),
    ]


async def test_load_of_another_model_is_not_found(server, adapter):
    server.on("GET", "/v1/models", MODELS)
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("other"), lambda f: None)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_unload_sleeps_at_the_deployments_level(server, adapter):
    server.on("GET", "/v1/models", MODELS)
    server.on("GET", "/is_sleeping", AWAKE, AWAKE, ASLEEP)
    server.on("POST", "/sleep", Reply(200))
    await adapter.load(LoadTarget(QWEN, options={"sleep_level": 2}), lambda f: None)
    await adapter.unload(QWEN)
    assert server.requests_to("POST", "/sleep")[0].query == {"level": ["2"]}


async def test_inference_while_asleep_is_refused(server, adapter):
    server.on("GET", "/is_sleeping", ASLEEP)
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", QWEN, CHAT))
    assert raised.value.code == ErrorCode.NOT_LOADED
    assert ("POST", "/v1/chat/completions") not in server.calls()


async def test_chat_and_stream(server, adapter):
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": QWEN}
    chunk = {**head, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    usage = {**head, "choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 4}}
    server.on("GET", "/is_sleeping", AWAKE)
    server.on("POST", "/v1/chat/completions", Reply(200, answer), Stream(sse(chunk, usage)))
    assert await adapter.run(InferenceCall("chat", QWEN, CHAT)) == answer
    payload = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    assert [c async for c in adapter.stream(InferenceCall("chat", QWEN, payload, True))] == [
        chunk,
        usage,
    ]
    sent = server.requests_to("POST", "/v1/chat/completions")
    assert sent[0].body == {**CHAT, "model": QWEN, "stream": False}
    assert sent[1].body == {**payload, "model": QWEN}
    assert sent[1].headers["Authorization"] == "Bearer vllm-key"


async def test_error_event_then_done_raises(server, adapter):
    error = {"error": {"message": "engine error", "type": "InternalServerError", "code": 500}}
    server.on("GET", "/is_sleeping", AWAKE)
    server.on("POST", "/v1/completions", Stream(sse(error)))
    call = InferenceCall("completion", QWEN, {"prompt": "x", "stream": True}, True)
    with pytest.raises(AdapterError) as raised:
        async for _ in adapter.stream(call):
            pass
    assert (raised.value.code, raised.value.message) == (ErrorCode.SERVER_ERROR, "engine error")


@pytest.mark.parametrize(
    "body",
    [
        {
            "error": {
                "message": "The model `foo` does not exist.",
                "type": "NotFoundError",
                "code": 404,
            }
        },
        {
            "object": "error",
            "message": "The model `foo` does not exist.",
            "type": "NotFoundError",
            "code": 404,
        },
    ],
    ids=["nested", "flat"],
)
async def test_unknown_model_in_both_error_envelopes(server, adapter, body):
    server.on("GET", "/is_sleeping", AWAKE)
    server.on("POST", "/v1/embeddings", Reply(404, body))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("embedding", "foo", {"input": "x"}))
    assert (raised.value.code, raised.value.message) == (
        ErrorCode.NOT_FOUND,
        "The model `foo` does not exist.",
    )


@pytest.mark.parametrize(
    "said, code",
    [
        (
            "This model's maximum context length is 40960 tokens. However, you requested"
            " 50000 tokens (49990 in the messages, 10 in the completion).",
            400,
        ),
        ("prompt too long: 50000 > 40960", "context_length_exceeded"),  # newer: by name
    ],
)
async def test_a_prompt_over_the_models_context_is_openais_context_length_exceeded(
    server, adapter, said, code
):
    """vLLM's own words for it (its 400), or OpenAI's code by name, as OpenAI's code that
    apps check; never retried."""
    server.on("GET", "/is_sleeping", AWAKE)
    body = {"object": "error", "message": said, "type": "BadRequestError", "code": code}
    server.on("POST", "/v1/chat/completions", Reply(400, body))
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", QWEN, CHAT))
    assert (raised.value.code, raised.value.message) == (ErrorCode.CONTEXT_LENGTH_EXCEEDED, said)
    assert not raised.value.retryable


async def test_health_of_a_dead_engine(server, adapter):
    server.on("GET", "/health", Reply(200), Reply(503))
    await adapter.health()
    with pytest.raises(AdapterError) as raised:
        await adapter.health()
    assert raised.value.server_fault


async def test_an_anthropic_message_is_refused_without_asking(server, adapter):
    """vLLM has no Messages API: a message fails bad_request and nothing is sent."""
    call = InferenceCall("message", "qwen", {"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(AdapterError) as raised:
        await adapter.run(call)
    assert raised.value.code == ErrorCode.BAD_REQUEST
    assert ("POST", "/v1/messages") not in server.calls()


METRICS = f"""# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{QWEN}"}} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{QWEN}"}} 2.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{QWEN}"}} 5.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="{QWEN}"}} 3.0
vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{QWEN}"}} 0.0
"""


async def test_its_metrics_say_what_it_runs_whoever_sent_it(server, adapter):
    """Clients that call vLLM directly: the requests it runs or queues now, and a count
    that moves with each it finishes (the status sync's "used since", the idle unload's
    "not while someone else's requests run")."""
    server.on("GET", "/metrics", Reply(200, METRICS), Reply(200, METRICS), Reply(200, METRICS))
    assert adapter.tells_activity
    assert tuple(await adapter.activity(QWEN)) == (3, 8)
    assert await adapter.running(QWEN) == 3
    assert await adapter.activity("other") is None  # its metrics do not name it


async def test_without_metrics_it_cannot_say(server, adapter):
    server.on("GET", "/metrics", Reply(404, {"detail": "Not Found"}), Reply(200, "not {metrics"))
    assert await adapter.activity(QWEN) is None
    assert await adapter.activity(QWEN) is None

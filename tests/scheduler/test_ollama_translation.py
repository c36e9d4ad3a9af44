"""Ollama's calls into OpenAI requests and OpenAI answers back into Ollama's, pure."""

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.api import intake, ollama_api
from scheduler.api.errors import ApiError
from scheduler.api.inference import Reply

HI = [{"role": "user", "content": "hi"}]


def translated(path: str, body: dict) -> tuple[str, dict, dict]:
    kind, raw, shape = ollama_api.translate(path, json.dumps(body).encode())
    return kind, json.loads(raw), shape


def sse(*chunks: dict | str) -> list[str]:
    return [": waiting, pending, position 1\n\n"] + [
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks
    ]


def ndjson(shape: dict, events: list[str]) -> list[dict]:
    async def collect() -> list[str]:
        async def source():
            for event in events:
                yield event

        return [line async for line in ollama_api.lines(shape, source())]

    out = asyncio.run(collect())
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in out)
    return [json.loads(line) for line in out]


def delta(**fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_tool_calls_go_out_with_arguments_as_a_string_and_tool_results_as_they_are():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "4 °C", "tool_name": "weather"},
    ]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    kind, body, shape = translated(
        "/api/chat", {"model": "m", "messages": messages, "tools": tools, "stream": False}
    )
    assert (kind, shape) == ("chat", {"path": "/api/chat", "model": "m", "stream": False})
    assert body["messages"][1]["tool_calls"] == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    assert body["messages"][2] == messages[2]
    assert body["tools"] == tools and "stream" not in body


def test_a_schema_format_asks_for_that_schema_and_minus_one_tokens_for_no_limit():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    _, body, _ = translated(
        "/api/chat",
        {"model": "m", "messages": HI, "format": schema, "options": {"num_predict": -1}},
    )
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema},
    }
    assert "max_tokens" not in body
    assert body["stream_options"] == {"include_usage": True}


def test_a_call_without_messages_or_prompt_only_loads():
    for path, body in [
        ("/api/chat", {"model": "m"}),
        ("/api/chat", {"model": "m", "messages": [], "format": "yaml"}),  # as Ollama: loads
        ("/api/generate", {"model": "m", "prompt": ""}),
    ]:
        assert translated(path, body)[2]["load_only"], (path, body)
    for path, body in [
        ("/api/chat", {"model": "m", "messages": HI}),
        ("/api/generate", {"model": "m", "prompt": "hi"}),
        ("/api/generate", {"model": "m", "images": ["aGk="]}),
    ]:
        assert "load_only" not in translated(path, body)[2], (path, body)


def test_think_turns_thinking_on_or_off_or_sets_an_effort():
    on = translated("/api/chat", {"model": "m", "messages": HI, "think": False})[1]
    assert on["chat_template_kwargs"] == {"enable_thinking": False}
    effort = translated("/api/generate", {"model": "m", "prompt": "hi", "think": "high"})[1]
    assert effort["reasoning_effort"] == "high" and "chat_template_kwargs" not in effort


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": HI, "options": [1]}, "options"),
        ({"model": "m", "messages": [{"role": "user", "images": "x"}]}, "messages[0].images"),
        ({"model": "m", "messages": HI, "format": "yaml"}, "format"),
        ({"model": "m", "messages": HI, "think": "very"}, "think"),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": {"a": 1}}]},
            "messages[0].tool_calls",
        ),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_the_field(body, param):
    with pytest.raises(ApiError) as refused:
        ollama_api.translate("/api/chat", json.dumps(body).encode())
    assert (refused.value.status, refused.value.param) == (400, param)


def test_a_streamed_chat_gives_text_and_thinking_lines_then_tool_calls_and_counts_last():
    shape = ollama_api.shape_of("/api/chat", "m", True)
    call = {"index": 0, "id": "c1", "function": {"name": "weather", "arguments": '{"ci'}}
    rest = {"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}
    events = sse(
        delta(reasoning_content="Switchyard: waiting, position 1 in line.\n"),
        delta(content="Hel"),
        delta(content="lo"),
        delta(tool_calls=[call]),
        delta(tool_calls=[rest]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}},
        "[DONE]",
    )
    out = ndjson(shape, events)
    assert out[0]["message"] == {"role": "assistant", "content": ""}  # the wait's line
    assert out[1]["message"]["thinking"].startswith("Switchyard: waiting")
    assert [o["message"]["content"] for o in out[2:4]] == ["Hel", "lo"]
    assert all(o["done"] is False and o["model"] == "m" for o in out[:-1])
    last = out[-1]
    assert (last["done"], last["done_reason"]) == (True, "stop")
    assert (last["prompt_eval_count"], last["eval_count"]) == (7, 2)
    assert last["message"]["tool_calls"] == [
        {"function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    ]
    assert len(out) == 5


def test_a_streamed_generate_says_response_and_an_error_ends_the_lines():
    shape = ollama_api.shape_of("/api/generate", "m", True)
    raw = {"choices": [{"index": 0, "text": "Hi", "finish_reason": "length"}]}
    out = ndjson(shape, sse(raw, {"error": {"message": "the server failed"}}, "[DONE]"))
    assert [o.get("response") for o in out[:2]] == ["", "Hi"]
    assert out[-1] == {"error": "the server failed"}


def test_a_finished_answer_in_ollamas_shape():
    result = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    body = ollama_api.answer_body(ollama_api.shape_of("/api/chat", "m"), result)
    assert body["message"] == {"role": "assistant", "content": "4", "thinking": "2+2"}
    assert (body["done_reason"], body["prompt_eval_count"], body["eval_count"]) == ("length", 3, 1)
    embedded = {"data": [{"index": 1, "embedding": [2]}, {"index": 0, "embedding": [1]}]}
    vectors = ollama_api.answer_body(ollama_api.shape_of("/api/embed", "e"), embedded)
    assert vectors["embeddings"] == [[1], [2]]


def test_an_answer_of_another_shape_is_a_clear_error_not_a_crash():
    shape = ollama_api.shape_of("/api/chat", "m")
    found = ollama_api.reply(shape, Reply(200, {}, {"choices": "none"}))
    assert found.status == 502 and "not one Ollama's API can give" in found.body["error"]
    out = ndjson({**shape, "stream": True}, sse({"choices": ["x"]}, "[DONE]"))
    assert "cannot give" in out[-1]["error"]


KEYS = ["model", "messages", "options", "format", "stream", "prompt", "system", "raw"]
KEYS += ["input", "think"]
INNER = ["role", "content", "images", "tool_calls", "function", "arguments", "num_predict"]
LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
VALUE = st.recursive(
    LEAF,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS + INNER), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ollama_api.PATHS), st.dictionaries(st.sampled_from(KEYS), VALUE))
def test_any_body_is_translated_into_one_the_checks_take_or_refused_clearly(path, body):
    """Bad input gets a 400 in a clear shape, never a crash: whatever Ollama's call holds,
    its translation is refused with an ApiError or passes the OpenAI door's own checks
    (which may refuse it, alike)."""
    try:
        kind, raw, _ = ollama_api.translate(path, json.dumps(body).encode())
        intake.validate_body(kind, json.loads(raw))
    except ApiError as refused:
        assert refused.status == 400

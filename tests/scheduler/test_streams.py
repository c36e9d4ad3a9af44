"""A relayed stream reaches the request's listeners chunk by chunk and is stored as the
non-streamed answer it adds up to."""

from collections.abc import AsyncIterator
from typing import Any

from channels.layers import get_channel_layer

from scheduler.announce import request_group
from scheduler.streams import Relay


def chunk(content: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def replay(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for c in chunks:
        yield c


async def test_stream_ending_in_a_usage_chunk_keeps_its_finish_reason() -> None:
    layer = get_channel_layer()
    listener = await layer.new_channel()
    await layer.group_add(request_group("r1"), listener)
    usage_chunk = {**chunk(""), "choices": [], "usage": USAGE}
    relay = Relay("r1")

    result = await relay.run(replay([chunk("Hel"), chunk("lo", "length"), usage_chunk]))

    received = [(await layer.receive(listener))["chunk"] for _ in range(3)]
    assert received == [chunk("Hel"), chunk("lo", "length"), usage_chunk]
    assert relay.sent
    assert result["object"] == "chat.completion"
    assert result["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello"},
            "finish_reason": "length",
        }
    ]
    assert result["usage"] == USAGE
    await layer.group_discard(request_group("r1"), listener)


async def test_completion_stream_assembles_text() -> None:
    text_chunk = {"id": "c", "object": "text_completion", "model": "m", "created": 1}
    chunks = [
        {**text_chunk, "choices": [{"index": 0, "text": "a", "finish_reason": None}]},
        {**text_chunk, "choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]},
    ]

    result = await Relay("r2").run(replay(chunks))

    assert result["object"] == "text_completion"
    assert result["choices"] == [{"index": 0, "text": "ab", "finish_reason": "stop"}]

"""A relayed stream reaches the request's listeners chunk by chunk and is stored as the
non-streamed answer it adds up to."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from channels.layers import get_channel_layer

from scheduler import streams
from scheduler.channel_hints import request_group
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


def committed() -> asyncio.Event:
    """The dispatch's commit came back."""
    done = asyncio.Event()
    done.set()
    return done


async def replay(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for c in chunks:
        yield c


async def test_stream_ending_in_a_usage_chunk_keeps_its_finish_reason() -> None:
    layer = get_channel_layer()
    listener = await layer.new_channel()
    await layer.group_add(request_group("r1"), listener)
    usage_chunk = {**chunk(""), "choices": [], "usage": USAGE}
    relay = Relay("r1", committed())

    result = await relay.run(replay([chunk("Hel"), chunk("lo", "length"), usage_chunk]))

    received: list[dict[str, Any]] = []
    numbers: list[int] = []  # each message's in the run: a listener tells a run begun again
    while len(received) < 3:
        message = await layer.receive(listener)
        received += message["chunks"]
        numbers.append(message["n"])
    assert received == [chunk("Hel"), chunk("lo", "length"), usage_chunk]
    assert numbers == list(range(len(numbers)))
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

    result = await Relay("r2", committed()).run(replay(chunks))

    assert result["object"] == "text_completion"
    assert result["choices"] == [{"index": 0, "text": "ab", "finish_reason": "stop"}]


def part(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish}


async def test_a_stream_of_tool_calls_reasoning_and_two_choices_is_stored_as_sent() -> None:
    """An agent's streamed turn: reasoning, then a tool call whose name and arguments come
    in pieces; and a second choice (`n: 2`) interleaved with the first. The stored answer
    is what the server would have answered unstreamed, each choice whole and apart."""
    head = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 3, "model": "m"}
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_"}}
    chunks = [
        {**head, "choices": [part(0, {"role": "assistant", "reasoning_content": "Look it"})]},
        {**head, "choices": [part(1, {"role": "assistant", "content": "It is"})]},
        {**head, "choices": [part(0, {"reasoning_content": " up."})]},
        {**head, "choices": [part(0, {"tool_calls": [call]})]},
        {**head, "choices": [part(1, {"content": " sunny."}, "stop")]},
        {
            **head,
            "choices": [
                part(
                    0,
                    {
                        "tool_calls": [
                            {"index": 0, "function": {"name": "weather", "arguments": '{"city": '}}
                        ]
                    },
                )
            ],
        },
        {
            **head,
            "choices": [
                part(0, {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]})
            ],
        },
        {**head, "choices": [part(0, {}, "tool_calls")]},
        {**head, "choices": [], "usage": USAGE},
    ]

    result = await Relay("r3", committed()).run(replay(chunks))

    weather = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert result["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Look it up.",
                "tool_calls": [{"id": "call_1", "type": "function", "function": weather}],
            },
            "finish_reason": "tool_calls",
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "It is sunny."},
            "finish_reason": "stop",
        },
    ]
    assert result["usage"] == USAGE
    # The live text, as the watch page and a caller's catch-up count it, is the first
    # choice's, as the stored answer's text is.
    assert streams.text_of(chunks) == "" == (streams.answer_text(result) or "")


async def test_chunks_that_come_while_one_is_published_go_together_and_none_waits(
    monkeypatch,
) -> None:
    published: list[list[str]] = []
    went_out = [asyncio.Event() for _ in range(3)]
    first_published = asyncio.Event()

    async def send(group: str, message: dict[str, Any]) -> None:
        published.append([c["choices"][0]["delta"]["content"] for c in message["chunks"]])
        went_out[len(published) - 1].set()
        if len(published) == 1:
            await first_published.wait()  # a slow publish

    monkeypatch.setattr(streams, "send", send)
    source: asyncio.Queue[dict | None] = asyncio.Queue()

    async def upstream() -> AsyncIterator[dict[str, Any]]:
        while (c := await source.get()) is not None:
            yield c
            source.task_done()  # taken in: the relay asks for the next

    relay = Relay("r3", committed())
    running = asyncio.create_task(relay.run(upstream()))
    source.put_nowait(chunk("a"))
    await went_out[0].wait()
    for text in ("b", "c"):
        source.put_nowait(chunk(text))
    await source.join()  # both taken in while the first is still being published

    first_published.set()
    async with asyncio.timeout(5):  # a guard: they go out with no chunk after them
        await went_out[1].wait()

    assert published == [["a"], ["b", "c"]]
    source.put_nowait(chunk("d", "stop"))
    source.put_nowait(None)
    result = await running
    assert published == [["a"], ["b", "c"], ["d"]]
    assert result["choices"][0]["message"]["content"] == "abcd"


async def test_no_chunk_goes_out_before_the_dispatch_commits(monkeypatch) -> None:
    published: list[list[str]] = []

    async def send(group: str, message: dict[str, Any]) -> None:
        published.append([c["choices"][0]["delta"]["content"] for c in message["chunks"]])

    monkeypatch.setattr(streams, "send", send)
    commit = asyncio.Event()
    relay = Relay("r4", commit)
    source: asyncio.Queue[dict | None] = asyncio.Queue()

    async def upstream() -> AsyncIterator[dict[str, Any]]:
        while (c := await source.get()) is not None:
            yield c
            source.task_done()

    running = asyncio.create_task(relay.run(upstream()))
    for text in ("a", "b"):
        source.put_nowait(chunk(text))
    await source.join()  # both taken in, the commit not back yet
    assert published == []

    commit.set()
    source.put_nowait(None)
    await running
    assert published == [["a", "b"]]

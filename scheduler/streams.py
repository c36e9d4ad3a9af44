"""Streamed output travels from the worker to the waiting API view over the channel layer
(a group per request); the assembled result is stored on the row."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from backends import messages_api, responses_api

from .channel_hints import request_group, send


class Relay:
    """Sends the chunks to the request's group as they come, and assembles the response.

    One message at a time: the chunks that arrive while one is being published go together
    in the next, so a burst (a fast server, a busy moment here) costs one publish instead
    of one each, and no chunk waits for a later one. `sent` tells, after a failure, whether
    the caller may already have seen part of the answer. Nothing goes out before
    `committed` is set (the worker's calls wait for it too): the caller must see no chunk
    of a send that the database refused."""

    def __init__(self, request_id, committed: asyncio.Event) -> None:
        self.committed = committed
        self.group = request_group(request_id)
        self.id = str(request_id)
        self.sent = False
        self.queued: list[dict[str, Any]] = []
        self.sender: asyncio.Task | None = None
        self.published = 0  # characters of text in the chunks published so far

    async def run(self, chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        text: list[str] = []
        last: dict[str, Any] = {}
        usage = None
        finish = "stop"
        response = None  # a Responses API stream's: its last event carries it whole
        message = messages_api.Message()  # an Anthropic Messages API stream's, event by event
        try:
            async for chunk in chunks:
                self.queue(chunk)
                last = chunk
                response = responses_api.final(chunk) or response
                message.add(chunk)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text.append(delta.get("content") or choice.get("text") or "")
                    # The usage chunk that may end a stream has no choices: keep the last reason.
                    finish = choice.get("finish_reason") or finish
        except asyncio.CancelledError:
            if self.sender is not None and not self.committed.is_set():
                self.sender.cancel()  # its send was refused: none of it may reach the caller
            raise
        finally:  # what came before an error reaches the caller before the error does
            if self.sender is not None:
                await self.sender
        return response or message.result() or assemble(last, "".join(text), usage, finish)

    def queue(self, chunk: dict[str, Any]) -> None:
        self.queued.append(chunk)
        self.sent = True
        if self.sender is None:
            self.sender = asyncio.create_task(self.publish())

    async def publish(self) -> None:
        try:
            await self.committed.wait()
            while self.queued:
                chunks, self.queued = self.queued, []
                # `at`: where its text begins in the answer, so that a caller can tell a gap
                # (a message lost with Redis) or a second run (another worker's) from the rest.
                message = {"type": "stream.chunk", "id": self.id, "chunks": chunks}
                await send(self.group, message | {"at": self.published})
                self.published += len(text_of(chunks))
        finally:
            self.sender = None


def text_of(chunks: list[dict[str, Any]]) -> str:
    """The text the chunks add to the answer (chat deltas, completion text, or the text
    deltas of a Responses or Anthropic Messages API stream)."""
    return "".join(
        responses_api.text_delta(chunk)
        + messages_api.text_delta(chunk)
        + "".join(
            (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            for choice in chunk.get("choices") or []
        )
        for chunk in chunks
    )


def assemble(last: dict[str, Any], text: str, usage: dict | None, finish: str) -> dict[str, Any]:
    is_chat = last.get("object", "").startswith("chat")
    choice = (
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        if is_chat
        else {"index": 0, "text": text, "finish_reason": finish}
    )
    return {
        "id": last.get("id", ""),
        "object": "chat.completion" if is_chat else "text_completion",
        "created": last.get("created", 0),
        "model": last.get("model", ""),
        "choices": [choice],
        "usage": usage,
    }

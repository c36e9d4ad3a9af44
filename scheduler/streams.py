"""Streamed output travels from the worker to the waiting API view over the channel layer
(a group per request); the assembled result is stored on the row."""

from collections.abc import AsyncIterator
from typing import Any

from .announce import request_group, send


class Relay:
    """Sends each chunk to the request's group and assembles the response. `sent` tells,
    after a failure, whether the caller already saw part of the answer."""

    def __init__(self, request_id) -> None:
        self.group = request_group(request_id)
        self.id = str(request_id)
        self.sent = False

    async def run(self, chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        text: list[str] = []
        last: dict[str, Any] = {}
        usage = None
        finish = "stop"
        async for chunk in chunks:
            await send(self.group, {"type": "stream.chunk", "id": self.id, "chunk": chunk})
            self.sent = True
            last = chunk
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text.append(delta.get("content") or choice.get("text") or "")
                # The usage chunk that may end a stream has no choices: keep the last reason.
                finish = choice.get("finish_reason") or finish
        return assemble(last, "".join(text), usage, finish)


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

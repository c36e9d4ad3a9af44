"""Streamed output travels from the worker to the waiting API view over the channel layer
(a group per request); the assembled result is stored on the row. `Relay` is the worker's
side; `CatchUp` the view's, which sends at the end what its caller never saw."""

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

from backends import chat_stream, messages_api, responses_api

from .api.errors import ApiError
from .channel_hints import request_group, send

# A watch page opened mid-answer asks the request's group for the text it missed; the
# caller's relay (`api.inference.tell_start`) answers the page's channel alone.
ASKED = "stream.asked"


class Relay:
    """Sends the chunks to the request's group as they come, and assembles the response.

    One message at a time: the chunks that arrive while one is being published go together
    in the next, so a burst (a fast server, a busy moment here) costs one publish instead
    of one each, and no chunk waits for a later one. `sent` tells, after a failure, whether
    the caller may already have seen part of the answer. Nothing goes out before
    `committed` is set (the worker's calls wait for it too): the caller must see no chunk
    of a send that the database refused."""

    def __init__(self, request_id, committed: asyncio.Event, usage_asked: bool = True) -> None:
        self.committed = committed
        # The server is always asked for a stream's usage (the stored answer counts its
        # tokens); a caller that did not ask is not sent the chunk that carries it alone.
        self.usage_asked = usage_asked
        self.group = request_group(request_id)
        self.id = str(request_id)
        self.sent = False
        self.queued: list[dict[str, Any]] = []
        self.sender: asyncio.Task | None = None
        self.published = 0  # characters of text in the chunks published so far
        self.messages = 0  # messages published so far

    async def run(self, chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        completion = chat_stream.Completion()
        response = None  # a Responses API stream's: its last event carries it whole
        message = messages_api.Message()  # an Anthropic Messages API stream's, event by event
        try:
            async for chunk in chunks:
                if self.usage_asked or not usage_only(chunk):
                    self.queue(chunk)
                response = responses_api.final(chunk) or response
                message.add(chunk)
                completion.add(chunk)
        except asyncio.CancelledError:
            if self.sender is not None and not self.committed.is_set():
                self.sender.cancel()  # its send was refused: none of it may reach the caller
            raise
        finally:  # what came before an error reaches the caller before the error does
            if self.sender is not None:
                await self.sender
        return response or message.result() or completion.result()

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
                # `at`: where its text begins in the answer; `n`: its number in this run. A
                # caller tells by them a gap (a message lost with Redis) or a second run
                # (another worker's, begun at n 0) from the rest.
                message = {"type": "stream.chunk", "id": self.id, "chunks": chunks}
                await send(self.group, message | {"at": self.published, "n": self.messages})
                self.published += len(text_of(chunks))
                self.messages += 1
        finally:
            self.sender = None


def usage_only(chunk: dict[str, Any]) -> bool:
    """The chunk that ends an OpenAI stream asked for its usage: no choices, the usage."""
    return chunk.get("choices") == [] and "usage" in chunk


def text_of(chunks: list[dict[str, Any]]) -> str:
    """The text the chunks add to the answer (the first choice's chat deltas or completion
    text, as `answer_text` reads it; or the text deltas of a Responses or Anthropic Messages
    API stream)."""
    return "".join(
        responses_api.text_delta(chunk)
        + messages_api.text_delta(chunk)
        + "".join(
            (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            for choice in chunk.get("choices") or []
            if choice.get("index", 0) == 0
        )
        for chunk in chunks
    )


class CatchUp:
    """What the caller saw, to send at the end what it never saw. A message that is not the
    next of its run stops the live relay: the rest comes with the end. A message that begins
    a run (`n` 0) after others is another worker's run of the request (the first one's
    process exited): it is followed, unseen, until it passes what the caller saw (its text,
    then as many events without text as the caller saw after it: a Messages stream's
    `message_start` before any text), and the caller gets the rest live; if it says
    otherwise, `diverged`. A caller that joined a run late (`live` false) follows a run
    begun again from its start."""

    def __init__(self) -> None:
        self.text = ""
        self.quiet = 0  # chunks without text the caller saw since the last with text
        self.live = True
        self.next = 0  # the number of the next message of the run the caller follows
        self.saw_end = False  # a Responses or Messages API stream's last event
        self.rerun: str | None = None  # the text of a run begun again, until it passes `text`
        self.rerun_quiet = 0  # its chunks without text since its text reached `text`'s end
        self.diverged = False
        self.stamp: dict[str, Any] = {}  # the first run's chunk `id` and `created`

    def relay(self, message: dict) -> list[dict[str, Any]]:
        """The chunks the caller gets now (and that count as seen)."""
        n = message.get("n", self.next)
        at = message.get("at", len(self.text))
        if self.diverged:
            return []
        if n == 0 and (self.next or not self.live):
            self.live, self.rerun, self.rerun_quiet = False, "", 0
        elif n != self.next:
            self.live, self.rerun = False, None
        self.next = n + 1
        if self.live and at == len(self.text):
            return self.seen(message["chunks"])
        if self.rerun is None or at != len(self.rerun):
            # A message lost with Redis: nothing more live, the rest comes with the end.
            self.live, self.rerun = False, None
            return []
        chunks = message["chunks"]
        for i, chunk in enumerate(chunks):
            if went_on := self.follow(chunk):
                self.live, self.rerun = True, None
                return self.seen([*went_on, *chunks[i + 1 :]])
        return []

    def follow(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """One chunk of a run begun again: [] while the caller has seen its like; else what
        of it the caller has not (and `diverged` if its text is not the caller's)."""
        added = text_of([chunk])
        self.rerun = (rerun := (self.rerun or "") + added)
        if not (self.text.startswith(rerun) or rerun.startswith(self.text)):
            self.diverged, self.rerun = True, None
            return []
        if len(rerun) > len(self.text):
            return [with_text(chunk, rerun[len(self.text) :])]
        if len(rerun) == len(self.text):
            self.rerun_quiet = 0 if added else self.rerun_quiet + 1
            if self.rerun_quiet > self.quiet:
                return [chunk]
        return []

    def seen(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for chunk in chunks:
            added = text_of([chunk])
            self.text += added
            self.quiet = 0 if added else self.quiet + 1
        self.saw_end |= any(responses_api.final(c) or messages_api.ends(c) for c in chunks)
        # Every chunk of a chat or completion stream carries the stream's id and time: a
        # second run's chunks go out under the first run's.
        for key in ("id", "created"):
            if key not in self.stamp:
                self.stamp |= next(({key: c[key]} for c in chunks if c.get(key)), {})
        return [c | {k: v for k, v in self.stamp.items() if k in c} for c in chunks]

    def ending(self, result: dict | None, request_id) -> list[dict[str, Any]]:
        """The events that complete what the caller saw of `result`: a chunk with the rest
        of its text (for a Responses or Messages API stream, then its last events, unless
        seen); an error if what it saw is not how the answer begins (the request ran twice
        and the second run said otherwise); none if it saw it all."""
        typed = responses_api.is_response(result) or messages_api.is_message(result)
        full = answer_text(result)
        if full is None or (self.saw_end if typed else full == self.text):
            return []
        if not full.startswith(self.text):
            return [diverged(request_id).body()]
        if responses_api.is_response(result):
            return responses_api.ending(result, self.text)
        if messages_api.is_message(result):
            return messages_api.ending(result, self.text)
        choice = result["choices"][0]
        is_chat = "message" in choice
        part = {"index": 0, "finish_reason": choice.get("finish_reason")}
        rest = full[len(self.text) :]
        part |= {"delta": {"content": rest}} if is_chat else {"text": rest}
        return [
            {
                "id": self.stamp.get("id") or result.get("id", ""),
                "object": "chat.completion.chunk" if is_chat else "text_completion",
                "created": self.stamp.get("created") or result.get("created", 0),
                "model": result.get("model", ""),
                "choices": [part],
            }
        ]


def diverged(request_id) -> ApiError:
    """The error that ends a stream whose request ran again and said otherwise."""
    return ApiError(
        502,
        f"Request {request_id} was run again after its worker stopped, and its answer"
        f" differs from the part already streamed; GET /api/v1/requests/{request_id}"
        " has the whole answer once it ends.",
        type="server_error",
        code="stream_diverged",
    )


def with_text(chunk: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of `chunk` whose text (as `text_of` reads it) is `text`."""
    chunk = copy.deepcopy(chunk)
    if responses_api.text_delta(chunk):
        chunk["delta"] = text
    elif messages_api.text_delta(chunk):
        chunk["delta"]["text"] = text
    else:
        choice = next(c for c in chunk["choices"] if c.get("index", 0) == 0)
        if (choice.get("delta") or {}).get("content"):
            choice["delta"]["content"] = text
        else:
            choice["text"] = text
    return chunk


def answer_text(result: dict | None) -> str | None:
    """The text of a finished chat, completion, response or message; None for an answer
    that has none (embeddings, reranks)."""
    if responses_api.is_response(result):
        return responses_api.output_text(result)
    if messages_api.is_message(result):
        return messages_api.message_text(result)
    choices = (result or {}).get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    first = choices[0]
    message = first.get("message")
    text = message.get("content") if isinstance(message, dict) else first.get("text")
    return text if isinstance(text, str) else None


def tool_calls_of(result: dict | None) -> list[str]:
    """The tools a finished answer calls, each as `name(arguments)`: a chat's tool calls, a
    message's `tool_use` blocks, a response's `function_call` items (the first choice's)."""
    if not isinstance(result, dict):
        return []
    if responses_api.is_response(result):
        items = result.get("output") or []
        found = [(i.get("name"), i.get("arguments")) for i in items if _is(i, "function_call")]
    elif messages_api.is_message(result):
        blocks = result.get("content") or []
        found = [(b.get("name"), json.dumps(b.get("input"))) for b in blocks if _is(b, "tool_use")]
    else:
        choices = result.get("choices") or [{}]
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        calls = (message or {}).get("tool_calls") if isinstance(message, dict) else None
        functions = [c.get("function") for c in calls or [] if isinstance(c, dict)]
        found = [(f.get("name"), f.get("arguments")) for f in functions if isinstance(f, dict)]
    return [f"{name}({arguments or ''})" for name, arguments in found if name]


def _is(item: object, kind: str) -> bool:
    return isinstance(item, dict) and item.get("type") == kind

"""What Switchyard reads of Anthropic's Messages API (`POST /v1/messages`), in one place.

A streamed message is a series of named events (`message_start`, `content_block_start`,
`content_block_delta`, …, `message_delta`, `message_stop`) with no `[DONE]` and no event
that holds the whole message: `Message` folds them into the message that is stored. Usage
says `input_tokens` and `output_tokens`, as the Responses API does.

For a server whose own Messages API Switchyard may not use (Ollama's would reset its
keep-alive and runner options), a message is asked as a chat completion (`as_chat`) and
its answer turned back (`from_chat`, `events_from_chat`): text in and out, no tools."""

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

END = "message_stop"
TEXT_DELTA = "text_delta"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# Anthropic's error types by HTTP status; its clients show `error.type` and `error.message`.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def event_type(chunk: dict[str, Any]) -> str:
    kind = chunk.get("type")
    return kind if isinstance(kind, str) else ""


def text_delta(chunk: dict[str, Any]) -> str:
    """The text an event adds to the answer."""
    if event_type(chunk) != "content_block_delta":
        return ""
    delta = chunk.get("delta") or {}
    text = delta.get("text") if delta.get("type") == TEXT_DELTA else None
    return text if isinstance(text, str) else ""


def ends(chunk: dict[str, Any]) -> bool:
    return event_type(chunk) == END


def is_message(result: Any) -> bool:
    return isinstance(result, dict) and result.get("type") == "message"


def message_text(message: dict[str, Any]) -> str:
    return "".join(
        block.get("text") or ""
        for block in message.get("content") or []
        if isinstance(block, dict) and block.get("type") == "text"
    )


class Message:
    """A streamed message's events folded into the message, as the server would have
    answered it unstreamed."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.partial_json: dict[int, str] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        kind = event_type(chunk)
        if kind == "message_start" and isinstance(chunk.get("message"), dict):
            self.message = {**chunk["message"], "content": []}
            return
        if self.message is None:
            return
        blocks: list = self.message["content"]
        index = chunk.get("index")
        if kind == "content_block_start" and isinstance(chunk.get("content_block"), dict):
            blocks.append(dict(chunk["content_block"]))
        elif kind == "content_block_delta" and isinstance(index, int) and index < len(blocks):
            delta, block = chunk.get("delta") or {}, blocks[index]
            for field in ("text", "thinking", "signature"):
                if isinstance(delta.get(field), str):
                    block[field] = block.get(field, "") + delta[field]
            if isinstance(delta.get("partial_json"), str):
                self.partial_json[index] = self.partial_json.get(index, "") + delta["partial_json"]
        elif kind == "content_block_stop" and index in self.partial_json:
            with contextlib.suppress(ValueError):  # a tool's input cut short stays as it began
                blocks[index]["input"] = json.loads(self.partial_json.pop(index) or "{}")
        elif kind == "message_delta":
            self.message.update(chunk.get("delta") or {})
            usage = {**(self.message.get("usage") or {}), **(chunk.get("usage") or {})}
            self.message["usage"] = usage

    def result(self) -> dict[str, Any] | None:
        return self.message


def ending(result: dict[str, Any], seen: str) -> list[dict[str, Any]]:
    """The events that complete a stream whose caller saw `seen` of the text but not its
    end: the rest of the text, then the message's stop reason and usage, and its stop."""
    rest = message_text(result)[len(seen) :]
    last = max(len(result.get("content") or []) - 1, 0)
    text = {"type": TEXT_DELTA, "text": rest}
    events = [{"type": "content_block_delta", "index": last, "delta": text}] if rest else []
    stop = {"stop_reason": result.get("stop_reason"), "stop_sequence": None}
    events.append({"type": "message_delta", "delta": stop, "usage": result.get("usage") or {}})
    return [*events, {"type": END}]


# -- asked as a chat ----------------------------------------------------------------------

SAME_IN_CHAT = ("max_tokens", "temperature", "top_p", "top_k", "stream")


def error_body(status: int, openai: dict | None) -> dict[str, Any]:
    """An error in Anthropic's shape, from one in OpenAI's (`{"error": {"message", …}}`);
    its `param` and `code`, where it has them, kept beside (Anthropic's clients ignore
    them, an app may read them)."""
    said = (openai or {}).get("error")
    said = said if isinstance(said, dict) else {"message": said}
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    error = {"type": kind, "message": said.get("message") or "the request failed"}
    error.update({k: said[k] for k in ("param", "code") if said.get(k) is not None})
    return {"type": "error", "error": error}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        block.get("text") or ""
        for block in content or []
        if isinstance(block, dict) and block.get("type") == "text"
    )


def as_chat(payload: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's body that asks what the message's `payload` asks; ValueError for
    what a chat completion cannot say here (tools)."""
    if payload.get("tools"):
        raise ValueError("tools in a message need a server with its own /v1/messages")
    messages = []
    if system := _text(payload.get("system")):
        messages.append({"role": "system", "content": system})
    for message in payload.get("messages") or []:
        messages.append({"role": message.get("role"), "content": _text(message.get("content"))})
    body = {k: payload[k] for k in SAME_IN_CHAT if k in payload}
    if "stop_sequences" in payload:
        body["stop"] = payload["stop_sequences"]
    return {**body, "model": payload.get("model"), "messages": messages}


def word_count(payload: dict[str, Any]) -> int:
    """The words of a message's system text and turns: the simulated server's count of its
    tokens (a real server counts with the model's tokenizer)."""
    texts = [_text(payload.get("system"))]
    texts += [_text(m.get("content")) for m in payload.get("messages") or [] if isinstance(m, dict)]
    return sum(len(text.split()) for text in texts)


def message_object(
    model: str, text: str, input_tokens: int, output_tokens: int, stop_reason: str | None
) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def from_chat(result: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's answer as a message."""
    choice = (result.get("choices") or [{}])[0]
    usage = result.get("usage") or {}
    return message_object(
        result.get("model", ""),
        (choice.get("message") or {}).get("content") or "",
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
    )


async def events_from_chat(
    model: str, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat completion (asked with its usage) as a message's events."""
    start = message_object(model, "", 0, 0, None)
    yield {"type": "message_start", "message": {**start, "content": []}}
    yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    usage, finish = {}, None
    async for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            finish = choice.get("finish_reason") or finish
            if text := (choice.get("delta") or {}).get("content"):
                yield {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": TEXT_DELTA, "text": text},
                }
    yield {"type": "content_block_stop", "index": 0}
    stop = {"stop_reason": STOP_REASONS.get(finish, "end_turn"), "stop_sequence": None}
    counted = {
        "input_tokens": usage.get("prompt_tokens", 0),
        "output_tokens": usage.get("completion_tokens", 0),
    }
    yield {"type": "message_delta", "delta": stop, "usage": counted}
    yield {"type": END}

"""What Switchyard reads of OpenAI's Responses API (`POST /v1/responses`), in one place.

A streamed response is a series of typed events (`response.created`, … ,
`response.output_text.delta`, … , `response.completed`) with no `[DONE]`: the last one
carries the whole response, which is what is stored. Its usage says `input_tokens` and
`output_tokens` where a chat completion says `prompt_tokens` and `completion_tokens`.

For a server without a Responses API of its own that Switchyard may use (Ollama's `/v1`
routes would reset its keep-alive and runner options), a response is asked as a chat
completion (`as_chat`) and its answer turned back (`from_chat`, `events_from_chat`): text in
and out, no tools."""

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

ENDS = ("response.completed", "response.incomplete")  # the last event; it holds the response
FAILS = ("response.failed", "error")  # "error": an Anthropic Messages API stream's too
TEXT_DELTA = "response.output_text.delta"


def event_type(chunk: dict[str, Any]) -> str:
    kind = chunk.get("type")
    return kind if isinstance(kind, str) else ""


def text_delta(chunk: dict[str, Any]) -> str:
    """The text an event adds to the answer."""
    delta = chunk.get("delta") if event_type(chunk) == TEXT_DELTA else None
    return delta if isinstance(delta, str) else ""


def final(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """The whole response, if `chunk` is the event that ends the stream."""
    response = chunk.get("response") if event_type(chunk) in ENDS else None
    return response if isinstance(response, dict) else None


def is_response(result: Any) -> bool:
    return isinstance(result, dict) and result.get("object") == "response"


def output_text(response: dict[str, Any]) -> str:
    """The text of a response's messages, as its streamed deltas add up to."""
    return "".join(
        part.get("text") or ""
        for item in response.get("output") or []
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    )


def error_message(chunk: dict[str, Any]) -> str:
    """What a failed response's event says went wrong."""
    error = chunk.get("error") or (chunk.get("response") or {}).get("error") or chunk
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else f"{event_type(chunk)} event"


def ending(result: dict[str, Any], seen: str) -> list[dict[str, Any]]:
    """The events that complete a stream whose caller saw `seen` of the text but not its
    end: the rest of the text, then the response itself."""
    rest = output_text(result)[len(seen) :]
    events = [{"type": TEXT_DELTA, "delta": rest}] if rest else []
    return [*events, {"type": "response.completed", "response": result}]


# A Responses API request's fields that mean the same in a chat completion.
SAME_IN_CHAT = (
    "temperature",
    "top_p",
    "seed",
    "stop",
    "user",
    "presence_penalty",
    "frequency_penalty",
)
ROLES = {"developer": "system"}


def as_chat(payload: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's body that asks what the response's `payload` asks; ValueError
    for what a chat completion cannot say (tools, inputs that are not messages)."""
    if payload.get("tools"):
        raise ValueError("tools in a response need a server with its own /v1/responses")
    messages = []
    if isinstance(payload.get("instructions"), str):
        messages.append({"role": "system", "content": payload["instructions"]})
    items = payload.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise ValueError("only messages (a role and content) can be sent here as input")
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
        messages.append({"role": ROLES.get(item["role"], item["role"]), "content": content or ""})
    body = {k: payload[k] for k in SAME_IN_CHAT if k in payload}
    if "max_output_tokens" in payload:
        body["max_tokens"] = payload["max_output_tokens"]
    return {**body, "model": payload.get("model"), "messages": messages}


def response_object(
    model: str, text: str, input_tokens: int, output_tokens: int, status: str = "completed"
) -> dict[str, Any]:
    """A response with one message of `text`, as a server's `/v1/responses` answers; one
    cut at its `max_output_tokens` is `incomplete` and says why, as OpenAI's does."""
    content = [{"type": "output_text", "text": text, "annotations": []}]
    message = {"type": "message", "role": "assistant", "status": "completed", "content": content}
    cut = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "incomplete_details": cut,
        "model": model,
        "output": [{"id": f"msg_{uuid.uuid4().hex}", **message}],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


def from_chat(result: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's answer as a response."""
    choice = (result.get("choices") or [{}])[0]
    usage = result.get("usage") or {}
    return response_object(
        result.get("model", ""),
        (choice.get("message") or {}).get("content") or "",
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        "incomplete" if choice.get("finish_reason") == "length" else "completed",
    )


async def events_from_chat(
    model: str, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat completion (asked with its usage) as a response's events."""
    text, usage, finish = [], {}, None
    async for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            finish = choice.get("finish_reason") or finish
            if delta := (choice.get("delta") or {}).get("content"):
                text.append(delta)
                yield {"type": TEXT_DELTA, "delta": delta}
    done = response_object(
        model,
        "".join(text),
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        "incomplete" if finish == "length" else "completed",
    )
    yield {"type": ENDS[1] if done["status"] == "incomplete" else ENDS[0], "response": done}

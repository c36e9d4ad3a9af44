"""Ollama's own API in front of the same line, for apps written for Ollama: the calls that
run a model, `POST /api/chat`, `/api/generate` and `/api/embed` (served by the bare ASGI
app); its listing calls are in `ollama_listing.py`.

A call is translated into the OpenAI request it means (a chat, a completion for a `raw`
generate, an embedding) and stored, queued and served like any other; its answer is
translated back: one JSON object, or (Ollama streams by default) newline-delimited JSON
objects ending with one that says `"done": true`. Errors are Ollama's `{"error": "…"}`.
What Switchyard decides for itself is ignored: `keep_alive` (it loads and unloads models by
its own rules), `options.num_ctx` (the server's setting)."""

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from backends import chat_stream

from ..models import RequestKind
from . import model_list
from .errors import ApiError
from .inference import Reply

PATHS = ("/api/chat", "/api/generate", "/api/embed")  # served by the bare ASGI app
LISTING = ("/api/tags", "/api/ps", "/api/show", "/api/version")  # by Django, as the rest
VERSION = "0.12.0"  # the Ollama API these calls follow; clients check it before using features
NDJSON = "application/x-ndjson"
UNREADABLE = (AttributeError, KeyError, TypeError, ValueError)  # an answer of another shape

# Ollama's options that mean an OpenAI sampling field (num_predict: the tokens to generate).
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "num_predict": "max_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repeat_penalty",
}
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


def refuse(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


# -- calls in ------------------------------------------------------------------------------


def shape_of(path: str, model: Any = None, stream: bool = False) -> dict:
    """What translating the answer back needs: the path called, the model as named, and
    whether the caller asked for lines."""
    return {"path": path, "model": model, "stream": stream}


def translate(path: str, raw: bytes) -> tuple[str, bytes, dict]:
    """(kind, the OpenAI body as bytes, its `shape_of`) for a call to `path`; a body that
    is not a JSON object is left for the OpenAI checks to refuse."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        return RequestKind.CHAT, raw, shape_of(path)  # refused as the OpenAI door refuses it
    model = body.get("model")
    stream = path != "/api/embed" and body.get("stream", True) is not False
    shape = shape_of(path, model, stream)
    if loads_only(path, body):
        done = "unload" if unloads(body.get("keep_alive")) else "load"
        return RequestKind.CHAT, raw, {**shape, "load_only": True, "done_reason": done}
    if path == "/api/embed":
        kind, out = RequestKind.EMBEDDING, {"model": model, "input": body.get("input")}
        if "dimensions" in body:
            out["dimensions"] = body["dimensions"]
        return kind, json.dumps(out).encode(), shape
    if path == "/api/generate" and body.get("raw"):
        kind, out = RequestKind.COMPLETION, {"model": model, "prompt": body.get("prompt", "")}
    elif path == "/api/generate":
        kind, out = RequestKind.CHAT, {"model": model, "messages": generate_messages(body)}
    else:
        kind = RequestKind.CHAT
        out = {"model": model, "messages": chat_messages(body.get("messages"))}
        if body.get("tools"):
            out["tools"] = body["tools"]
    out.update(sampling(body.get("options")))
    out.update(thinking(body.get("think")))
    if (response_format := format_of(body.get("format"))) is not None:
        out["response_format"] = response_format
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # the last line's token counts
    return kind, json.dumps(out).encode(), shape


def loads_only(path: str, body: dict) -> bool:
    """Ollama's call to load a model and do nothing else: a chat without messages, or a
    generate without a prompt or images (its CLI sends one before `ollama run`)."""
    if path == "/api/chat":
        return not body.get("messages")
    return path == "/api/generate" and not body.get("prompt") and not body.get("images")


def unloads(keep_alive: Any) -> bool:
    """Ollama's `keep_alive` of zero (`0`, `"0"`, `"0s"`, `"0m"`): with nothing to run,
    the call that unloads a model (`ollama stop`)."""
    if isinstance(keep_alive, str):
        keep_alive = keep_alive.strip().rstrip("hms")
    try:
        return float(keep_alive) == 0
    except (TypeError, ValueError):
        return False


async def load_only(shape: dict, api_key) -> Reply:
    """A load-only call (`loads_only`), answered at once in Ollama's shape for a model the
    key may use and a server has: Switchyard loads a model when a request for it needs it,
    and unloads it, by its own rules (as for `keep_alive`), so there is nothing to wait for.
    An unload call is answered as Ollama answers it (`done_reason: unload`); the model,
    which other callers may be using, leaves when the policy decides."""
    name = shape["model"]
    try:
        if not isinstance(name, str) or not name:
            raise refuse("model must be a model's name", "model")
        await model_list.deployed_model(api_key, name)
    except ApiError as error:
        return Reply(error.status, error.headers(), error_body(error.body()))
    said = {"message": {"role": "assistant", "content": ""}}
    if shape["path"] != "/api/chat":
        said = {"response": ""}
    return Reply(
        200, {}, {**head(shape), **said, "done": True, "done_reason": shape["done_reason"]}
    )


def sampling(options: Any) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise refuse("options must be an object", "options")
    out = {OPTIONS[k]: v for k, v in options.items() if k in OPTIONS}
    limit = out.get("max_tokens")
    if isinstance(limit, int | float) and limit < 0:
        del out["max_tokens"]  # Ollama's -1: until the model stops
    return out


def thinking(think: Any) -> dict:
    """Ollama's `think`: true or false turns a thinking model's thinking on or off (the
    chat template's `enable_thinking`, as llama-server and vLLM take it); "low", "medium" or
    "high" is a reasoning effort (gpt-oss)."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"chat_template_kwargs": {"enable_thinking": think}}
    if think in ("low", "medium", "high"):
        return {"reasoning_effort": think}
    raise refuse('think must be true, false, "low", "medium" or "high"', "think")


def format_of(value: Any) -> dict | None:
    """Ollama's `format`: "json", or a JSON schema the answer must follow."""
    if value in (None, ""):
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "answer", "schema": value}}
    raise refuse('format must be "json" or a JSON schema', "format")


def chat_messages(messages: Any) -> Any:
    """Ollama's messages as OpenAI's: images as data URLs beside the text, tool calls with
    their arguments as a JSON string."""
    if not isinstance(messages, list):
        return messages  # refused by the chat's own checks
    return [chat_message(m, i) if isinstance(m, dict) else m for i, m in enumerate(messages)]


def chat_message(message: dict, index: int) -> dict:
    out = {k: v for k, v in message.items() if k not in ("images", "tool_calls", "thinking")}
    images = message.get("images") or []
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise refuse("images must be a list of base64 strings", f"messages[{index}].images")
    if images:
        parts = [{"type": "text", "text": message.get("content") or ""}]
        parts += [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
        out["content"] = parts
    if calls := message.get("tool_calls"):
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
        ):
            raise refuse(
                "tool_calls must be a list of objects, each with a function",
                f"messages[{index}].tool_calls",
            )
        out["tool_calls"] = [tool_call_out(call, n) for n, call in enumerate(calls)]
    return out


def data_url(image: str) -> str:
    return image if image.startswith("data:") else f"data:image/png;base64,{image}"


def tool_call_out(call: dict, n: int) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    return {
        "id": call.get("id") or f"call_{n}",
        "type": "function",
        "function": {
            "name": function.get("name"),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def generate_messages(body: dict) -> list[dict]:
    """A generate's prompt (and system prompt) as a chat: the server applies the model's
    template, as Ollama does when `raw` is not set."""
    messages = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    user = {"role": "user", "content": body.get("prompt", ""), "images": body.get("images")}
    return [*messages, chat_message(user, len(messages))]


# -- answers out ---------------------------------------------------------------------------


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def head(shape: dict) -> dict:
    return {"model": shape["model"], "created_at": now_iso()}


def counts(usage: dict | None) -> dict:
    if not usage:
        return {}
    return {
        "prompt_eval_count": usage.get("prompt_tokens", 0),
        "eval_count": usage.get("completion_tokens", 0),
    }


def message_in(message: dict) -> dict:
    """An OpenAI assistant message as Ollama's: its reasoning as `thinking`, tool calls'
    arguments as objects."""
    out = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        out["thinking"] = message["reasoning_content"]
    if calls := message.get("tool_calls"):
        out["tool_calls"] = [tool_call_in(call) for call in calls]
    return out


def tool_call_in(call: dict) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = {"arguments": arguments}  # as the model wrote it
    return {"function": {"name": function.get("name"), "arguments": parsed}}


def answer_body(shape: dict, result: dict) -> dict:
    """A finished request's OpenAI answer as Ollama's."""
    if shape["path"] == "/api/embed":
        vectors = [d.get("embedding") for d in sorted(result.get("data", []), key=index_of)]
        usage = result.get("usage") or {}
        return {
            "model": shape["model"],
            "embeddings": vectors,
            "prompt_eval_count": usage.get("prompt_tokens", 0),
        }
    choice = (result.get("choices") or [{}])[0]
    done = {
        "done": True,
        "done_reason": DONE_REASONS.get(choice.get("finish_reason"), "stop"),
        **counts(result.get("usage")),
    }
    if shape["path"] == "/api/chat":
        return {**head(shape), "message": message_in(choice.get("message") or {}), **done}
    text = choice["text"] if "text" in choice else (choice.get("message") or {}).get("content")
    return {**head(shape), "response": text or "", **done}


def index_of(item: dict) -> int:
    return item.get("index", 0)


def error_body(body: dict | None) -> dict:
    error = (body or {}).get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return {"error": message or "the request failed"}


def reply(shape: dict, found: Reply) -> Reply:
    """The OpenAI door's reply to the translated call, as Ollama's."""
    if found.events is not None:
        events = lines(shape, found.events)
    elif found.status >= 400 or found.body is None:
        return Reply(found.status, found.headers, error_body(found.body), then=found.then)
    else:
        try:
            body = answer_body(shape, found.body)
        except UNREADABLE:
            shown = json.dumps(found.body)[:200]
            body = {"error": f"the server's answer is not one Ollama's API can give: {shown}"}
            return Reply(502, found.headers, body, then=found.then)
        if not shape["stream"]:
            return Reply(found.status, found.headers, body, then=found.then)
        events = one_line(body)  # a stream asked for, its answer already there (a replay)
    return Reply(found.status, found.headers, events=events, then=found.then, media_type=NDJSON)


async def one_line(body: dict) -> AsyncIterator[str]:
    yield json.dumps(body) + "\n"


async def lines(shape: dict, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The relay's SSE events as Ollama's lines: a line a chunk of text (or of thinking,
    where the caller asked to see its wait as thinking), then the last, `done`, with the
    reason and token counts. While it waits, a line with no text for each SSE comment (at
    once, then every SWITCHYARD_WAITING_COMMENT_S): the answer's headers go at once, and a
    client's read timeout does not run out during a long load. Tool calls, streamed in
    pieces, go in the last line once whole, as Ollama sends them."""
    said = chat_stream.Completion()
    try:
        async for event in events:
            found = payloads(event)
            if not found:
                yield json.dumps(part_line(shape, "")) + "\n"
            for data in found:
                if data == "[DONE]":
                    yield json.dumps({**head(shape), **last(shape, said)}) + "\n"
                    return
                try:
                    chunk = json.loads(data)
                    line = error_body(chunk) if "error" in chunk else chunk_line(shape, chunk, said)
                except UNREADABLE:
                    line = {
                        "error": f"the server sent a chunk Ollama's API cannot give: {data[:200]}"
                    }
                if line is not None:
                    yield json.dumps(line) + "\n"
                if line is not None and "error" in line:
                    return
    finally:
        await events.aclose()  # its `finally` cancels a request whose caller left


def payloads(event: str) -> list[str]:
    """The `data:` payloads of one or more SSE events (comments and names skipped)."""
    return [line.removeprefix("data: ") for line in event.split("\n") if line.startswith("data: ")]


def chunk_line(shape: dict, chunk: dict, said: chat_stream.Completion) -> dict | None:
    said.add(chunk)  # its tool calls, reason and usage, for the last line
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = choice["text"] if "text" in choice else delta.get("content")  # a raw generate's
    thinking = delta.get("reasoning_content")
    if not text and not thinking:
        return None
    return part_line(shape, text or "", thinking)


def part_line(shape: dict, text: str, thinking: str | None = None) -> dict:
    """A line of text (or of thinking) before the last: a chat's message, a generate's
    response."""
    if shape["path"] == "/api/chat":
        message = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        return {**head(shape), "message": message, "done": False}
    line = {**head(shape), "response": text, "done": False}
    if thinking:
        line["thinking"] = thinking
    return line


def last(shape: dict, said: chat_stream.Completion) -> dict:
    whole = said.result()
    choice = whole["choices"][0]
    reason = DONE_REASONS.get(choice["finish_reason"], "stop")
    done = {"done": True, "done_reason": reason, **counts(whole["usage"])}
    if shape["path"] != "/api/chat":
        return {"response": "", **done}
    message = {"role": "assistant", "content": ""}
    if calls := choice.get("message", {}).get("tool_calls"):
        message["tool_calls"] = [tool_call_in(c) for c in calls]
    return {"message": message, **done}

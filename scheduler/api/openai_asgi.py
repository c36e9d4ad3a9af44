"""The inference endpoints as a bare ASGI app, served in front of Django (Ollama's too,
translated: `ollama_api`).

Every inference call comes through these paths, and Django's request handling cost more
web-process CPU than all of Switchyard's own work for a call (about 2 ms a request on a
2-core machine, measured: a thread per request for its signals, three hops to it and back,
the URL resolver, the response machinery). They need none of it: no session, middleware or
template, and their database work runs in pool threads (`in_pool_thread`). Everything else,
`/v1/models` included, is Django's."""

import asyncio
import contextlib
import dataclasses
import json
import logging
from typing import Any

from django.conf import settings

from access import auth
from backends import messages_api

from .. import faults
from ..models import RequestKind
from ..pool_threads import in_pool_thread
from . import ollama_api, recovery, web_stop
from .errors import ApiError, request_too_large
from .inference import Reply, answer, error_event, run_detached, stream_end

log = logging.getLogger(__name__)

KINDS = {
    "/v1/chat/completions": RequestKind.CHAT,
    "/v1/completions": RequestKind.COMPLETION,
    "/v1/embeddings": RequestKind.EMBEDDING,
    "/v1/rerank": RequestKind.RERANK,
    "/v1/responses": RequestKind.RESPONSE,
    "/v1/messages": RequestKind.MESSAGE,
    "/v1/messages/count_tokens": RequestKind.COUNT_TOKENS,
}
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


async def app(scope: dict[str, Any], receive, send) -> None:
    """Answer the call; should the caller hang up first, stop (and `answer` cancels the
    request it was waiting for). Ollama's paths are translated in and out
    (`ollama_api`)."""
    path = scope["path"]
    ollama = ollama_api.shape_of(path) if path in ollama_api.PATHS else None
    anthropic = path in ANTHROPIC_PATHS
    if scope["method"] != "POST":
        error = ApiError(
            405, f"{scope['method']} is not allowed here; use POST.", code="method_not_allowed"
        )
        refused = Reply.error(error)
        refused.headers["Allow"] = "POST"
        await send_reply(send, refused, ollama, anthropic)
        return
    try:
        api_key = await auth.acaller(
            auth.authorization(header(scope, b"authorization"), header(scope, b"x-api-key"))
        )
        raw = await read_body(receive)
    except ApiError as error:
        await send_reply(send, Reply.error(error), ollama, anthropic)
        return
    except faults.DATABASE_FAULTS as exc:  # finding the caller's key: nothing is stored yet
        log.warning("finding the caller's key failed: %s", exc)
        await in_pool_thread(faults.check_pool)()
        unavailable = Reply.error(recovery.unavailable("The database"))
        await send_reply(send, unavailable, ollama, anthropic)
        return
    if raw is None:
        return
    if ollama is None:
        kind = KINDS[path]
    else:
        try:
            kind, raw, ollama = ollama_api.translate(path, raw)
        except ApiError as error:
            await send_reply(send, Reply.error(error), ollama)
            return
        if ollama.get("load_only"):  # answered in Ollama's shape already
            await send_reply(send, await ollama_api.load_only(ollama, api_key))
            return
    priority = header(scope, b"x-priority")
    idempotency_key = header(scope, b"idempotency-key")
    progress = header(scope, b"x-switchyard-progress")
    replying = asyncio.create_task(
        reply(kind, raw, priority, send, api_key, idempotency_key, progress, ollama, anthropic)
    )
    hang_up = asyncio.create_task(receive())  # all that can come now is http.disconnect
    try:
        await asyncio.wait([replying, hang_up], return_when=asyncio.FIRST_COMPLETED)
    finally:
        hang_up.cancel()
        replying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replying


async def read_body(receive) -> bytes | None:
    """The whole body, or None if the caller hung up while sending it."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise request_too_large()
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def header(scope: dict[str, Any], name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


async def reply(
    kind: str,
    raw: bytes,
    priority: str | None,
    send,
    api_key=None,
    idempotency_key=None,
    progress: str | None = None,
    ollama: dict | None = None,
    anthropic: bool = False,
) -> None:
    try:
        found = await answer(kind, raw, priority, api_key, idempotency_key, progress)
    except Exception as exc:
        found = Reply.error(failed(exc, f"answering a {kind} request"))
    try:
        await send_reply(send, found, ollama, anthropic, kind)
    finally:
        if found.then is not None:
            # In a task of its own: daphne reports the caller gone as soon as the answer
            # is sent, and `app` then cancels this one.
            run_detached(found.then())


async def send_reply(
    send,
    found: Reply,
    ollama: dict | None = None,
    anthropic: bool = False,
    kind: str | None = None,
) -> None:
    """Send `found`; for a call to Ollama's API (`ollama`: `ollama_api.shape_of` the call),
    in Ollama's shape; an error to a call to Anthropic's (`anthropic`), in Anthropic's. A
    stream that fails midway ends as streams of its `kind` end."""
    if ollama is not None:
        found = ollama_api.reply(ollama, found)
    elif anthropic and found.events is None and found.status >= 400:
        found = dataclasses.replace(found, body=messages_api.error_body(found.status, found.body))
    headers = dict(found.headers)
    if found.events is None:
        body = json.dumps(found.body).encode()
        headers["Content-Length"] = str(len(body))
        await send(start(found.status, "application/json", headers))
        await send(part(body))
        return
    # Closed here, not when collected: its `finally` cancels a request whose caller left and
    # ends the subscription. Started before anything is sent, so that it has a `finally` to
    # run even if the caller leaves during the first send.
    async with contextlib.aclosing(found.events) as events:
        first = await anext(events)
        await send(start(found.status, found.media_type, headers))
        await send(part(first.encode(), more=True))
        try:
            async for event in events:
                await send(part(event.encode(), more=True))
        except asyncio.CancelledError:
            if not web_stop.stopping():
                raise  # the caller hung up: nobody is left to tell
            # This web process stops (a restart): the stream ends as every stream ends, and
            # says where its request goes on.
            told = web_stop.restarting(headers.get("X-Request-Id"))
            with contextlib.suppress(Exception):
                await send(part(last_event(told, ollama, kind)))
            raise
        except Exception as exc:  # the status is sent: say why in the body, then end it
            error = failed(exc, f"relaying request {headers.get('X-Request-Id')}")
            with contextlib.suppress(Exception):
                await send(part(last_event(error, ollama, kind), more=True))
    await send(part(b""))


def last_event(error: ApiError, ollama: dict | None, kind: str | None) -> bytes:
    """A stream's end after its status was sent: the error, then its end (an NDJSON error
    line for Ollama's API, a named `error` event for Anthropic's)."""
    if ollama is not None:
        return (json.dumps(ollama_api.error_body(error.body())) + "\n").encode()
    return (error_event(error, kind) + stream_end(kind)).encode()


def failed(exc: Exception, doing: str) -> ApiError:
    """The error for a fault we did not foresee: a service's (503) or our own (500)."""
    if faults.is_transient(exc):
        log.warning("%s failed: %s: %s", doing, type(exc).__name__, exc)
        return ApiError(
            503,
            f"A service Switchyard needs failed ({type(exc).__name__}) while {doing}; the"
            " X-Request-Id header, if sent, names the request to poll.",
            type="server_error",
            code="unavailable",
        )
    log.exception("%s failed", doing)
    return ApiError(
        500, "Switchyard failed; its log tells why.", type="server_error", code="internal"
    )


def start(status: int, content_type: str, headers: dict[str, str]) -> dict[str, Any]:
    pairs = [(b"content-type", content_type.encode())]
    pairs += [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": pairs}


def part(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": body, "more_body": more}

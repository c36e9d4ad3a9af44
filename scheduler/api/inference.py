"""The OpenAI-compatible endpoints: store the request, wait for it, answer or relay SSE."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.http import HttpRequest
from django.utils import timezone

from access import auth
from access.models import STREAM_PROGRESS
from access.watch import watch_url
from backends import messages_api
from dashboard import eta_checks

from .. import faults
from ..channel_hints import send
from ..models import WAITING_STATES, Request, RequestKind, State
from ..pool_threads import in_pool_thread
from ..reasons_shown import reported_fraction
from ..reasons_shown import shown as shown_reason
from ..streams import ASKED, CatchUp, diverged
from . import idempotency, intake, recovery, web_stop
from .errors import ApiError, too_deep
from .waiting import (
    Subscription,
    cancel_abandoned,
    finished_after,
    state_unknown,
    until_finished,
)

FAILED_STATUS = {
    "bad_request": 400,
    "context_length_exceeded": 400,
    "model_not_deployed": 404,
    "model_not_found": 404,
    "model_unavailable": 503,
    "not_found": 404,
    "load_failed": 503,
    "expired": 503,
}


def error_of(request: Request) -> ApiError:
    """The OpenAI-shaped error for a request that did not complete."""
    if request.state == State.EXPIRED:
        return ApiError(
            503,
            request.error or "expired while waiting",
            type="server_error",
            code="expired",
            retry_after_s=30,
        )
    if request.state == State.CANCELLED:
        why = f": {request.error}" if request.error else ""
        return ApiError(409, f"the request was cancelled{why}", code="cancelled")
    if request.error_code == "no_server_available":
        # Nothing could serve it: worth another try once a server is back.
        return ApiError(
            503, request.error, type="server_error", code=request.error_code, retry_after_s=30
        )
    status = FAILED_STATUS.get(request.error_code, 502)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return ApiError(
        status,
        request.error or "the request failed",
        type=kind,
        code=request.error_code or "upstream_error",
    )


def parse_json(raw: bytes):
    try:
        return json.loads(raw or b"")
    except RecursionError:
        raise too_deep() from None
    except ValueError as exc:
        raise ApiError(
            400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from exc


@dataclass
class Reply:
    """What an endpoint answers: a JSON body, or (`events`) a stream of SSE events."""

    status: int
    headers: dict[str, str]
    body: dict | None = None
    events: AsyncIterator[str] | None = None
    # Work the caller need not wait for: done once the reply has gone (or failed to).
    then: Callable[[], Awaitable[None]] | None = None
    media_type: str = "text/event-stream"  # of `events`

    @classmethod
    def error(cls, error: ApiError, request_id=None) -> "Reply":
        headers = error.headers()
        if request_id is not None:
            headers["X-Request-Id"] = str(request_id)  # its trace tells why
        return cls(error.status, headers, error.body())


async def answer(
    kind: str,
    raw: bytes,
    priority: str | None,
    api_key=None,
    idempotency_key: str | None = None,
    progress: str | None = None,
) -> Reply:
    """Store the request, then wait for its end (or relay its events as they come). With
    an Idempotency-Key that stored a request already: that request (see `replay`).
    `progress`: the caller's `X-Switchyard-Progress` (see `shows_progress`)."""
    try:
        body = parse_json(raw)
        in_reasoning = shows_progress(progress, kind, api_key)
        claim = idempotency.claim_of(idempotency_key, api_key)
        if claim is not None and (earlier := await in_pool_thread(claim.request)()):
            return await replay(earlier, kind, in_reasoning)
        sub = await subscribe()
        storing = asyncio.ensure_future(
            in_pool_thread(recovery.accept)(
                kind,
                body,
                priority,
                sub.request_id,
                caller_waits=True,
                api_key=api_key,
                idempotency=claim,
            )
        )
        try:
            request = await asyncio.shield(storing)
        except asyncio.CancelledError:
            if claim is None:  # with a key, its caller may come back for it
                cancel_once_stored(storing)
            await sub.close()
            raise
        except IntegrityError:
            await sub.close()
            if claim is None or (earlier := await in_pool_thread(claim.request)()) is None:
                raise
            return await replay(earlier, kind, in_reasoning)  # the same key, stored first
        except BaseException:
            await sub.close()
            raise
    except ApiError as error:
        return Reply.error(error)
    # A caller with a key may come back for it: hanging up does not cancel its request.
    return await respond(request, sub, hang_up_cancels=claim is None, progress=in_reasoning)


_detached: set[asyncio.Task] = set()  # held here until done: the loop holds tasks weakly


def run_detached(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` in a task of its own, which outlives the caller's (one the server cancels
    when its caller goes)."""
    task = asyncio.create_task(work)
    _detached.add(task)
    task.add_done_callback(_detached.discard)


def cancel_once_stored(storing: asyncio.Future) -> None:
    """The caller hung up while its request was being stored, and the store runs on in its
    thread: once it is stored, cancel it (nobody is left to read its answer)."""

    async def cancel() -> None:
        try:
            request = await storing
        except Exception:  # refused, or the database failed: nothing waits
            return
        await cancel_abandoned(request.pk)

    run_detached(cancel())


def shows_progress(asked: str | None, kind: str, api_key=None) -> bool:
    """Whether a streamed chat shows its wait as `reasoning_content` chunks (chat apps show
    them as the model's thinking): as `X-Switchyard-Progress` asks, else as the caller's
    key says (`ApiKey.stream_progress`), else `SWITCHYARD_STREAM_PROGRESS`; `comments` (SSE
    comments only, which apps do not show) or `reasoning`."""
    choice = asked or (api_key and api_key.stream_progress)
    choice = choice or settings.SWITCHYARD["STREAM_PROGRESS"]
    if choice not in STREAM_PROGRESS:
        raise ApiError(
            400,
            f"X-Switchyard-Progress must be one of {', '.join(STREAM_PROGRESS)}.",
            param="X-Switchyard-Progress",
            code="invalid_value",
        )
    return choice == "reasoning" and kind == "chat"


async def replay(earlier: Request, kind: str, progress: bool = False) -> Reply:
    """The request an Idempotency-Key stored: its answer, or its end once it comes. A
    stream not yet started is relayed from its start; one under way, as one chunk at its end
    (the chunks already sent are not kept)."""
    if error := idempotency.reused(earlier, kind):
        return Reply.error(error, earlier.pk)
    sub = await Subscription(earlier.pk).open()
    try:
        now = await sub.current()
        if now is None:
            raise state_unknown(earlier.pk)
    except BaseException:
        await sub.close()
        raise
    live = now.state in WAITING_STATES
    reply = await respond(now, sub, hang_up_cancels=False, live=live, progress=progress)
    reply.headers["Idempotent-Replayed"] = "true"
    return reply


async def respond(
    request: Request,
    sub: Subscription,
    *,
    hang_up_cancels: bool = True,
    live: bool = True,
    progress: bool = False,
) -> Reply:
    accepted = accepted_headers(request)
    if request.stream:
        headers = {"Cache-Control": "no-cache", **accepted}
        events = relay_sse(
            sub, known=request, live=live, hang_up_cancels=hang_up_cancels, progress=progress
        )
        return Reply(200, headers, events=events)
    try:
        if request.is_terminal:
            finished = request
        else:
            finished = await until_finished(sub, settings.SWITCHYARD["WAITING_COMMENT_S"])
    except ApiError as lost:
        reply = Reply.error(lost, request.pk)
    except asyncio.CancelledError:
        await sub.close()
        if web_stop.stopping():
            # Cut by this web process stopping, not by its caller: say where the request
            # goes on (it is not cancelled), instead of closing the connection unanswered.
            # With an Idempotency-Key (its hang-up cancels nothing) a resend is safe.
            told = web_stop.restarting(request.pk, resend_safe=not hang_up_cancels)
            return Reply.error(told, request.pk)
        if hang_up_cancels:
            await cancel_abandoned(request.pk)
        raise
    else:
        if finished.state == State.COMPLETED:
            reply = Reply(200, accepted, finished.result)
        else:
            reply = Reply.error(error_of(finished), finished.pk)
            reply.headers.update(accepted)
    reply.then = sub.close  # a round trip to the channel layer: after the answer
    return reply


def accepted_headers(request: Request) -> dict[str, str]:
    """What every answer to an accepted request says: its id, the class it ran at, where
    its caller (or whoever they give the link to) can watch it, and what its key has left
    (`x-ratelimit-*`, as it was let in)."""
    return {
        "X-Request-Id": str(request.pk),
        "X-Switchyard-Priority": request.priority_name,
        "X-Switchyard-Watch-Url": watch_url(request.pk),
        **getattr(request, "rate_limits", {}),
    }


async def subscribe() -> Subscription:
    """A new request's subscription; if Redis fails here, nothing is stored yet."""
    try:
        return await Subscription().open()
    except faults.REDIS_FAULTS as exc:
        faults.REDIS.failed(exc, "subscribing a new request")
        raise recovery.unavailable("Redis") from exc


async def relay_sse(
    sub: Subscription,
    *,
    known: Request,
    live: bool = True,
    hang_up_cancels: bool = True,
    progress: bool = False,
) -> AsyncIterator[str]:
    """Chunks as the worker sends them; a comment with the position while waiting (with
    `progress`, a `reasoning_content` chunk too, when what it says changed). Chunks that
    never came (Redis was down; or not `live`: a replay that joined late) come with the end,
    as one chunk. A run begun again (its worker's process exited) is relayed from where the
    caller is, or ends the stream with `stream_diverged` the moment it says otherwise."""
    every_s = settings.SWITCHYARD["WAITING_COMMENT_S"]
    request_id = sub.request_id
    finished = False
    relayed = CatchUp()
    relayed.live = live
    said: tuple[str, str] | None = None  # where and why, as the last progress line said
    try:
        yield f": queued as {request_id}\n\n"
        try:
            if known.is_terminal:
                finished = True
                for event in ending(known, relayed, known.kind):
                    yield event
                return
            async for message in sub.messages(every_s):
                if message and message["type"] == "stream.chunk":
                    if chunks := relayed.relay(message):
                        yield "".join(sse_event(c) for c in chunks)
                    elif relayed.diverged:  # known now: no need to wait for its end
                        finished = True  # it runs on: its answer is kept for GET
                        yield error_event(diverged(request_id), known.kind)
                        yield stream_end(known.kind)
                        return
                    continue
                if message and message["type"] == ASKED:
                    await tell_start(message, relayed)
                    continue
                if message is None:
                    request = await sub.current()
                    if request is None:  # the database is down; the request may run on
                        yield ": waiting, the database is not answering\n\n"
                        continue
                    if not request.is_terminal:
                        waiting = await waiting_state(request)
                        yield waiting.comment(request.state)
                        # Until the model speaks: then the thinking is its own. A line
                        # each time where or why changes: not for the ETA counting down.
                        changed = (waiting.where, waiting.why) != said
                        if progress and not relayed.text and changed:
                            said = (waiting.where, waiting.why)
                            if line := waiting.progress_line():
                                chunk = progress_chunk(request, line)
                                yield f"data: {json.dumps(chunk)}\n\n"
                        continue
                else:
                    request = await finished_after(sub, message)
                    if request is None:
                        continue
                finished = True
                for event in ending(request, relayed, known.kind):
                    yield event
                return
        except ApiError as lost:  # its row is gone, or unreadable: see waiting
            finished = True
            yield error_event(lost, known.kind)
            if end := stream_end(known.kind):
                yield end
    finally:
        if not finished and hang_up_cancels:
            await cancel_abandoned(request_id)
        await sub.close()


async def tell_start(asked: dict, relayed: "CatchUp") -> None:
    """A watch page opened mid-answer asks for the text it missed: the caller's relay is the
    one place that holds it (the row gets it only at the end)."""
    if relayed.live and relayed.text:
        await send(asked["channel"], {"type": "stream.start", "text": relayed.text}, one=True)


def ending(request: Request, relayed: "CatchUp", kind: str) -> list[str]:
    """A finished request's last events: its error, or what of its text was not relayed.
    (`kind`: the request's, which a row told by its hint does not carry.)"""
    if request.state != State.COMPLETED:
        last = [error_event(error_of(request), kind)]
    elif missed := relayed.ending(request.result, request.pk):
        last = [sse_event(event) for event in missed]
    else:
        last = []
    return [*last, stream_end(kind)]


def stream_end(kind: str | None) -> str:
    """What ends a stream: `data: [DONE]` for OpenAI's chat and completions; the Responses
    API's and Anthropic's streams end with their last event (none follows)."""
    return "" if kind in (RequestKind.RESPONSE, RequestKind.MESSAGE) else "data: [DONE]\n\n"


def error_event(error: ApiError, kind: str | None) -> str:
    """A stream's error event: in Anthropic's shape, and named, for a message (Anthropic's
    clients read named events only)."""
    if kind == RequestKind.MESSAGE:
        return sse_event(messages_api.error_body(error.status, error.body()))
    return sse_event(error.body())


def sse_event(chunk: dict) -> str:
    """One SSE event, named by its type where it has one (the events of the Responses and
    Anthropic Messages APIs: Anthropic's clients read named events only)."""
    kind = chunk.get("type")
    named = f"event: {kind}\n" if isinstance(kind, str) else ""
    return f"{named}data: {json.dumps(chunk)}\n\n"


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a stream says of a request not yet ended: where it is (`position 3`, or
    `processing`), when it is sent (`sent in ~12 s`, or ""), and why it waits (or "")."""

    where: str
    when: str
    why: str

    def tail(self) -> str:
        return (f", {self.when}" if self.when else "") + (f": {self.why}" if self.why else "")

    def comment(self, state: str) -> str:
        if self.where == "processing":  # at its server, no token yet (a long prompt)
            return ": processing\n\n"
        return f": waiting, {state}, {self.where}{self.tail()}\n\n"

    def progress_line(self) -> str:
        """The wait as a chat app shows it; none once at the server."""
        if self.where == "processing":
            return ""
        return f"Switchyard: waiting, {self.where} in line{self.tail()}.\n"


def place_and_eta(request: Request) -> tuple[int | None, float | None, float | None]:
    """Its place in line, the seconds until it is sent (the worker's last forecast for
    it, counted down) and how far its model's load has come by its server's own figure;
    None for each when not waiting, not yet forecast or not reported."""
    position = intake.position_in_line(request)
    eta = eta_checks.left_s(request.pk, timezone.now()) if position else None
    return position, eta, reported_fraction(request)


async def waiting_state(request: Request) -> Waiting:
    try:
        position, eta, reported = await in_pool_thread(place_and_eta)(request)
    except faults.DATABASE_FAULTS:
        position = eta = reported = None
    why = shown_reason(request.reason, request.state, timezone.now(), reported=reported)
    return Waiting(
        f"position {position}" if position else "processing",
        sent_in(eta),
        why["text"] if why else "",
    )


def sent_in(eta_s: float | None) -> str:
    """An ETA as a stream says it: past its time, "any moment", as the dashboard says."""
    if eta_s is None:
        return ""
    return "sent any moment" if eta_s < 0.5 else f"sent in ~{eta_s:.0f} s"


def progress_chunk(request: Request, line: str) -> dict:
    """A chat chunk that carries `line` as `reasoning_content`, as reasoning models send
    their thinking (and llama-swap its loading remarks)."""
    delta = {"reasoning_content": line}
    return {
        "id": f"chatcmpl-{request.pk.hex}",
        "object": "chat.completion.chunk",
        "created": int(request.created_at.timestamp()),
        "model": request.model_name,
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


def key_of(http: HttpRequest) -> str | None:
    return auth.authorization(http.headers.get("Authorization"), http.headers.get("x-api-key"))

"""The OpenAI-compatible endpoints: store the request, wait for it, answer or relay SSE."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from access import auth
from access.watch import watch_url
from backends.models import Model

from ..models import Request, State
from ..pool_threads import released
from . import intake
from .errors import ApiError, too_deep
from .waiting import (
    Subscription,
    cancel_abandoned,
    current,
    finished_after,
    until_finished,
)

FAILED_STATUS = {
    "bad_request": 400,
    "model_not_deployed": 404,
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
        return ApiError(409, "the request was cancelled", code="cancelled")
    if request.error_code == "no_server_available":
        # Nothing could serve it: worth another try once a server is back.
        return ApiError(
            503, request.error, type="server_error", code=request.error_code, retry_after_s=30
        )
    status = FAILED_STATUS.get(request.error_code, 502)
    kind = "invalid_request_error" if status == 400 else "server_error"
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

    @classmethod
    def error(cls, error: ApiError, request_id=None) -> "Reply":
        headers = error.headers()
        if request_id is not None:
            headers["X-Request-Id"] = str(request_id)  # its trace tells why
        return cls(error.status, headers, error.body())


async def answer(kind: str, raw: bytes, priority: str | None, api_key=None) -> Reply:
    """Store the request, then wait for its end (or relay its events as they come)."""
    try:
        body = parse_json(raw)
        sub = await Subscription().open()
        try:
            request = await released(intake.accept)(
                kind, body, priority, sub.request_id, caller_waits=True, api_key=api_key
            )
        except BaseException:
            await sub.close()
            raise
    except ApiError as error:
        return Reply.error(error)
    accepted = accepted_headers(request)
    if request.stream:
        headers = {"Cache-Control": "no-cache", **accepted}
        return Reply(200, headers, events=relay_sse(sub))
    try:
        finished = await until_finished(sub, settings.SWITCHYARD["WAITING_COMMENT_S"])
    except ApiError as lost:
        reply = Reply.error(lost)
    except asyncio.CancelledError:
        await cancel_abandoned(request.pk)
        await sub.close()
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
    """What every answer to an accepted request says: its id, the class it ran at and
    where its caller (or whoever they give the link to) can watch it."""
    return {
        "X-Request-Id": str(request.pk),
        "X-Switchyard-Priority": request.priority_name,
        "X-Switchyard-Watch-Url": watch_url(request.pk),
    }


async def relay_sse(sub: Subscription) -> AsyncIterator[str]:
    """Chunks as the worker sends them; a comment with the position while waiting."""
    every_s = settings.SWITCHYARD["WAITING_COMMENT_S"]
    request_id = sub.request_id
    finished = False
    try:
        yield f": queued as {request_id}\n\n"
        try:
            async for message in sub.messages(every_s):
                if message and message["type"] == "stream.chunk":
                    yield "".join(f"data: {json.dumps(c)}\n\n" for c in message["chunks"])
                    continue
                if message is None:
                    request = await current(request_id)
                    if not request.is_terminal:
                        position = await released(intake.position_in_line)(request)
                        where = f"position {position}" if position else "processing"
                        yield f": waiting, {request.state}, {where}\n\n"
                        continue
                else:
                    request = await finished_after(request_id, message)
                    if request is None:
                        continue
                finished = True
                if request.state != State.COMPLETED:
                    yield f"data: {json.dumps(error_of(request).body())}\n\n"
                yield "data: [DONE]\n\n"
                return
        except ApiError as lost:  # its row is gone: see waiting.current
            finished = True
            yield f"data: {json.dumps(lost.body())}\n\n"
            yield "data: [DONE]\n\n"
    finally:
        if not finished:
            await cancel_abandoned(request_id)
        await sub.close()


@require_GET
async def list_models(http: HttpRequest) -> HttpResponse:
    """The models the caller may use (all, for a key with no list of models)."""
    try:
        api_key = await auth.acaller(http.headers.get("Authorization"))
    except ApiError as error:
        return error.as_json_response()
    data = []
    async for model in Model.objects.order_by("name"):
        names = [model.name, *(model.aliases or [])]
        if api_key is not None and not any(api_key.allows_model(n) for n in names):
            continue
        for name in names:
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "switchyard",
                    "type": model.type,
                }
            )
    return JsonResponse({"object": "list", "data": data})

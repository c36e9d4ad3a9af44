"""A web process stopping (SIGTERM): it drains, then stops.

Draining, it takes no new connection and answers new calls on open ones `503 restarting`
(nothing stored), long polls at once (`unless_draining`), while the calls it holds go on to
their answers, for up to `SWITCHYARD_DRAIN_S`. Then it stops: the calls still open are cut,
and their callers told where their requests go on (they are not cancelled: their callers
did not hang up)."""

import asyncio
from collections.abc import Awaitable

from .errors import ApiError

_draining = False
_stopping = False
_long_polls: set[asyncio.Event] = set()  # set when the drain begins


def begin_drain() -> None:
    """On the event loop's thread (daphne's reactor runs on it)."""
    global _draining
    _draining = True
    for begun in _long_polls:
        begun.set()


async def unless_draining(work: Awaitable) -> None:
    """`work` (a long poll's wait), cut short when this process begins to drain: a long
    poll may answer early, and its caller polls again, at a process that stays up. Waiting
    out the drain instead, it was cut unanswered."""
    task = asyncio.ensure_future(work)
    begun = asyncio.Event()
    _long_polls.add(begun)
    drain = asyncio.ensure_future(begun.wait())
    try:
        if not _draining:
            await asyncio.wait([task, drain], return_when=asyncio.FIRST_COMPLETED)
    finally:
        _long_polls.discard(begun)
        for pending in (task, drain):
            pending.cancel()
        await asyncio.gather(task, drain, return_exceptions=True)
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()


def stop() -> None:
    """The calls this process cuts from now on were not hung up by their callers."""
    global _draining, _stopping
    _draining = _stopping = True


def draining() -> bool:
    """Whether this web process takes no new calls (it drains, or stops)."""
    return _draining


def stopping() -> bool:
    """Whether this web process cuts its open calls (`stop`)."""
    return _stopping


def not_taken() -> ApiError:
    """A new call while this process drains: nothing was stored, and another connection
    (another web process, or this one restarted) takes it."""
    return ApiError(
        503,
        "Switchyard's web process is restarting and takes no new calls; nothing was stored:"
        " send it again.",
        type="server_error",
        code="restarting",
        retry_after_s=1,
    )


def restarting(request_id, resend_safe: bool | None = None) -> ApiError:
    """What a caller whose call this web process cuts as it stops is told: the request goes
    on, and where its answer will be. `resend_safe`: whether the call had an Idempotency-Key
    (a resend then gets the answer); without one, clients are told not to resend by
    themselves (`x-should-retry: false`): it would run again. None: not known (a stream)."""
    where = f"/api/v1/requests/{request_id}"
    said = f"Switchyard's web process is restarting. Request {request_id} goes on"
    if resend_safe is False:
        return ApiError(
            503,
            f"{said}: read its answer at {where} (sending it again would run it twice).",
            type="server_error",
            code="restarting",
            should_retry=False,
        )
    return ApiError(
        503,
        f"{said}: read its answer at {where}, or resend with the same Idempotency-Key.",
        type="server_error",
        code="restarting",
        retry_after_s=1,
    )

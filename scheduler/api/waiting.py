"""Waiting for a request without holding a thread: listen on its channel-layer group, and
re-read the row now and then in case a hint was missed."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async

from .. import faults
from ..models import TERMINAL_STATES, Request, State
from ..pool_threads import in_pool_thread
from ..store.completion import cancel_request
from . import web_stop
from .errors import ApiError
from .inbox import WAKE, Message, inbox

# While Redis or the database is down, a waiter re-reads its row this often: hints may be
# lost, and the caller must learn of its end within a second of it.
DEGRADED_EVERY_S = 0.5
# A waiter whose row cannot be read for this long stops waiting, naming the request and
# where to read its state later (it may still run: the worker does not need the web).
GIVE_UP_AFTER_S = 30.0


class Subscription:
    """Hints about one request. A new request subscribes before its row exists, so that no
    hint can be missed."""

    def __init__(self, request_id: uuid.UUID | None = None) -> None:
        self.inbox = inbox()
        self.request_id = request_id or self.inbox.new_request_id()
        self.queue: asyncio.Queue[Message] | None = None
        self.faulted_since: float | None = None  # the database failed our reads since then

    async def open(self) -> "Subscription":
        self.queue = await self.inbox.subscribe(self.request_id)
        return self

    async def close(self) -> None:
        if self.queue is not None:
            await self.inbox.unsubscribe(self.request_id, self.queue)
            self.queue = None

    async def messages(self, every_s: float) -> AsyncIterator[Message | None]:
        """Hints as they come; None every `every_s` seconds of silence."""
        assert self.queue is not None, "open() first"
        while True:
            degraded = faults.REDIS.down or self.faulted_since is not None
            wait_s = min(every_s, DEGRADED_EVERY_S) if degraded else every_s
            try:
                async with asyncio.timeout(wait_s):  # no task per wait, as wait_for makes
                    message = await self.queue.get()
            except TimeoutError:
                yield None
            else:
                yield None if message is WAKE else message

    async def current(self) -> Request | None:
        """The row, or None while the database fails (it may come back): the waiter waits
        on. After GIVE_UP_AFTER_S of faults, an error that names the request and where to
        poll its state."""
        try:
            found = await current(self.request_id)
        except ApiError:
            raise
        except Exception as exc:
            if not faults.is_database_fault(exc):
                raise
            await in_pool_thread(faults.check_pool)()
            now = time.monotonic()
            self.faulted_since = self.faulted_since or now
            if now - self.faulted_since > GIVE_UP_AFTER_S:
                raise state_unknown(self.request_id) from exc
            return None
        self.faulted_since = None
        return found


class StateUnknown(ApiError):
    """The request may be stored and may run, but its state cannot be read now: the caller
    learns its id (in the message and in X-Request-Id) and where to poll. No Retry-After:
    sending it again could run it twice (unless with the same Idempotency-Key)."""

    def __init__(self, request_id, message: str) -> None:
        super().__init__(503, message, type="server_error", code="request_state_unknown")
        self.request_id = request_id

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "X-Request-Id": str(self.request_id)}


def state_unknown(request_id) -> StateUnknown:
    return StateUnknown(
        request_id,
        f"The database is not answering; request {request_id} may have been stored and may"
        f" still run. Poll GET /api/v1/requests/{request_id} for its state (404: it was not"
        " stored; send it again, with the same Idempotency-Key).",
    )


def stored(request_id) -> Request | None:
    """The request's row with its server, or None if there is none."""
    return Request.objects.select_related("server").filter(pk=request_id).first()


@in_pool_thread
def current(request_id) -> Request:
    found = stored(request_id)
    if found is None:
        # Deleted by an operator, or its insert had not reached the disk when the database
        # crashed (see intake.accept).
        raise ApiError(
            503,
            "The request's row is gone (deleted, or lost in a database crash before it was"
            " stored durably). Send it again.",
            type="server_error",
            code="request_lost",
            retry_after_s=1,
        )
    return found


def told_outcome(request_id, message: Message) -> Request | None:
    """The finished request as its hint tells it, when the hint carries all the answer
    needs (an unsaved row: a terminal row never changes again)."""
    state, outcome = message.get("state"), message.get("outcome")
    if outcome is None or state not in TERMINAL_STATES:
        return None
    needed = {State.COMPLETED: "result", State.FAILED: "error", State.EXPIRED: "error"}
    if state in needed and needed[state] not in outcome:
        return None
    return Request(id=request_id, state=state, **outcome)


async def finished_after(sub: Subscription, message: Message | None) -> Request | None:
    """The request if `message` (or, when it tells too little, the row) says it finished."""
    if message is not None:
        if told := told_outcome(sub.request_id, message):
            return told
        if message.get("state") not in TERMINAL_STATES:
            return None
    request = await sub.current()
    return request if request is not None and request.is_terminal else None


async def until_finished(sub: Subscription, every_s: float) -> Request:
    async for message in sub.messages(every_s):
        if finished := await finished_after(sub, message):
            return finished
    raise AssertionError("unreachable")


async def cancel_abandoned(request_id) -> None:
    """The caller went away: cancel the request, at its server too if it is processing (no
    one is left to read the answer; the server stops generating). Not when the web process
    itself is stopping (`web_stop`)."""
    if web_stop.stopping():
        return
    await asyncio.shield(sync_to_async(cancel_request)(request_id, "the caller disconnected"))

"""Waiting for a request without holding a thread: listen on its channel-layer group, and
re-read the row now and then in case a hint was missed."""

import asyncio
import uuid
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async

from ..models import TERMINAL_STATES, WAITING_STATES, Request, State
from ..pool_threads import released
from ..transitions import move
from .errors import ApiError
from .inbox import Message, inbox


class Subscription:
    """Hints about one request. A new request subscribes before its row exists, so that no
    hint can be missed."""

    def __init__(self, request_id: uuid.UUID | None = None) -> None:
        self.inbox = inbox()
        self.request_id = request_id or self.inbox.new_request_id()
        self.queue: asyncio.Queue[Message] | None = None

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
            try:
                async with asyncio.timeout(every_s):  # no task per wait, as wait_for makes
                    message = await self.queue.get()
            except TimeoutError:
                yield None
            else:
                yield message


def stored(request_id) -> Request | None:
    """The request's row with its server, or None if there is none."""
    return Request.objects.select_related("server").filter(pk=request_id).first()


@released
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


async def finished_after(request_id, message: Message | None) -> Request | None:
    """The request if `message` (or, when it tells too little, the row) says it finished."""
    if message is not None:
        if told := told_outcome(request_id, message):
            return told
        if message.get("state") not in TERMINAL_STATES:
            return None
    request = await current(request_id)
    return request if request.is_terminal else None


async def until_finished(sub: Subscription, every_s: float) -> Request:
    async for message in sub.messages(every_s):
        if finished := await finished_after(sub.request_id, message):
            return finished
    raise AssertionError("unreachable")


async def cancel_abandoned(request_id) -> None:
    """The caller went away: cancel unless it is already processing (then it finishes)."""
    await asyncio.shield(
        sync_to_async(move)(
            request_id,
            WAITING_STATES,
            State.CANCELLED,
            "the caller disconnected before it was processed",
        )
    )

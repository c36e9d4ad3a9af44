"""Waiting for a request without holding a thread: listen on its channel-layer group, and
re-read the row now and then in case a hint was missed."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from ..announce import request_group
from ..models import TERMINAL_STATES, Request, State
from ..transitions import move


class Subscription:
    """Subscribe before the row exists, so that no hint can be missed."""

    def __init__(self) -> None:
        self.request_id = uuid.uuid4()
        self.layer = get_channel_layer()
        self.channel = ""

    async def open(self) -> "Subscription":
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(request_group(self.request_id), self.channel)
        return self

    async def close(self) -> None:
        await self.layer.group_discard(request_group(self.request_id), self.channel)

    async def messages(self, every_s: float) -> AsyncIterator[dict[str, Any] | None]:
        """Hints as they come; None every `every_s` seconds of silence."""
        while True:
            try:
                yield await asyncio.wait_for(self.layer.receive(self.channel), every_s)
            except TimeoutError:
                yield None


async def current(request_id) -> Request:
    return await Request.objects.select_related("server").aget(pk=request_id)


async def until_finished(sub: Subscription, every_s: float) -> Request:
    async for message in sub.messages(every_s):
        if message is None or message.get("state") in TERMINAL_STATES:
            request = await current(sub.request_id)
            if request.is_terminal:
                return request
    raise AssertionError("unreachable")


async def cancel_abandoned(request_id) -> None:
    """The caller went away: cancel unless it is already processing (then it finishes)."""
    await asyncio.shield(
        sync_to_async(move)(
            request_id,
            [State.PENDING, State.NEEDS_LOADING, State.READY],
            State.CANCELLED,
            "the caller disconnected before it was processed",
        )
    )

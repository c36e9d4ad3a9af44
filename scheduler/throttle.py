"""Hints come in bursts (a load reports progress, ten requests move at once); a dashboard
needs the state after the burst, not one re-read (or one message) per hint."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Throttle:
    """Runs `push` at most once per `interval_s`, and always once more after the last hint:
    hints that arrive while a push waits or runs fold into the next push."""

    def __init__(
        self,
        push: Callable[[], Awaitable[None]],
        interval_s: float,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.push = push
        self.interval_s = interval_s
        self.clock = clock  # the running loop's, unless a test brings a virtual one
        self.sleep = sleep
        self.dirty = False
        self.last_push = float("-inf")
        self.task: asyncio.Task | None = None

    def hint(self) -> None:
        self.dirty = True
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.drain())

    async def drain(self) -> None:
        now = self.clock or asyncio.get_running_loop().time
        while self.dirty:
            # A rate limit, not a wait for an event. Again until it has passed: uvloop's
            # timers may fire up to a millisecond early (4.02 pushes a second at 0.25 s).
            while (wait := self.last_push + self.interval_s - now()) > 0:
                await self.sleep(wait)
            self.dirty = False  # hints from here on need another push
            self.last_push = now()
            try:
                await self.push()
            except Exception:  # the next hint tries again; the page keeps its last state
                log.exception("could not push the dashboard's state")

    async def flush(self) -> None:
        """Until the push owed for the last hint is done."""
        if self.task is not None:
            await self.task

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

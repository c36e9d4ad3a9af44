"""Effects for driving the worker's loop in a test without patching it: every task the loop
asks for is recorded by name and its work dropped (no server is called, no adapter built),
and the clock is the test's."""

import asyncio
from collections.abc import Coroutine
from datetime import datetime

from django.utils import timezone

from scheduler.runtime import Effects
from scheduler.runtime.effects import TaskEnded
from scheduler.wakeup import Listener


async def _nothing() -> None:
    return None


class RecordingEffects(Effects):
    def __init__(self, now: datetime | None = None) -> None:
        super().__init__(clock=lambda: self.at)
        self.at = now or timezone.now()
        self.started: list[str] = []  # the names of the tasks asked for, in order

    def start(self, name: str, work: Coroutine, ended: TaskEnded) -> asyncio.Task:
        work.close()
        self.started.append(name)
        return super().start(name, _nothing(), ended)

    def listeners(self, news: Listener) -> list:
        return []

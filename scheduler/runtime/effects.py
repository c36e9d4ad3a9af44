"""The worker's hands: everything the loop does to the world outside the database.

The loop decides; `Effects` carries out what reaches past the database: the clock it reads,
the adapters that call the servers, the tasks it starts (and their supervision), the
chores no task waits for, and the hints it publishes (the channel layer's outbox, the
wake-ups it hears). A test hands the loop another `Effects` (tests/support/effects.py
records what it is asked to start, on a virtual clock) instead of patching the runtime.

Everything here is touched on the event loop's thread only.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from backends.adapters.base import Adapter, AdapterError, ErrorCode
from backends.adapters.registry import adapter_for, settings_of
from backends.models import Server

from .. import channel_hints, faults, store, wakeup
from ..database_thread import in_database_thread
from ..wakeup import Listener

log = logging.getLogger(__name__)

TaskEnded = Callable[[str, asyncio.Task], None]


class Effects:
    def __init__(self, clock: Callable[[], datetime] = timezone.now) -> None:
        self.clock = clock
        self.adapters: dict[int, Adapter] = {}
        self.built_from: dict[int, tuple] = {}  # server → the settings its adapter has
        self.retired: list[Adapter] = []  # replaced after an edit; closed at stop
        self.tasks: dict[str, asyncio.Task] = {}  # named tasks under way
        self.chores: set[asyncio.Future] = set()  # writes no task waits for to the end
        self.closed = False  # its adapters closed: the worker has stopped

    # -- the clock -----------------------------------------------------------------------

    def now(self) -> datetime:
        """The time the policy plans with."""
        return self.clock()

    def monotonic(self) -> float:
        """For intervals (status syncs, purges, health marks)."""
        return time.monotonic()

    # -- tasks ---------------------------------------------------------------------------

    def start(self, name: str, work: Coroutine, ended: TaskEnded) -> asyncio.Task:
        """Run `work` as the task `name`; `ended(name, task)` once it is done."""
        task = asyncio.create_task(work, name=name)
        if self.closed:
            # Started after the worker stopped (the serve tasks of a send whose commit came
            # back late, the status sync their failure asks for): nothing can reach a server
            # now, and what it held is handed back. Cancelled before it runs.
            task.cancel()
        self.tasks[name] = task

        def finished(t: asyncio.Task) -> None:
            self.tasks.pop(name, None)
            ended(name, t)

        task.add_done_callback(finished)
        return task

    def running(self, name: str) -> bool:
        return name in self.tasks

    def cancel(self, name: str) -> asyncio.Task | None:
        """Cancel the task `name`, if under way; returns it (to await its end)."""
        task = self.tasks.get(name)
        if task is not None:
            task.cancel()
        return task

    def serving(self) -> list[asyncio.Task]:
        """The tasks of requests at their servers."""
        return [task for name, task in self.tasks.items() if name.startswith("serve ")]

    def chore(self, write: Coroutine) -> None:
        """A database write no task waits for (awaited when the worker stops)."""
        future = asyncio.ensure_future(write)
        self.chores.add(future)
        future.add_done_callback(self.chore_done)

    def chore_done(self, future: asyncio.Future) -> None:
        self.chores.discard(future)
        if future.cancelled() or (error := future.exception()) is None:
            return
        if faults.is_database_fault(error):  # the worker starts again (`restarts`)
            log.info("a write no task waits for met a database fault: %r", error)
        else:
            log.error("a write no task waits for failed", exc_info=error)

    async def cancel_all(self) -> None:
        """Cancel the tasks, and wait for them and the chores to end; and the tasks that a
        cancelled one starts as it ends (a failed call's status sync), which would otherwise
        run on into the adapters closed after this."""
        while running := [task for task in self.tasks.values() if not task.done()]:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        await asyncio.gather(*self.chores, return_exceptions=True)

    # -- adapters ------------------------------------------------------------------------

    async def adapter(self, server_id: int) -> Adapter:
        if server_id not in self.adapters:
            found = await in_database_thread(store.server_for_adapter)(server_id)
            if found is None:  # deleted since a pass planned for it: as if unreachable
                raise AdapterError(ErrorCode.CONNECTION, f"server #{server_id} was deleted")
            server, spelled = found
            # Tasks that start together (a status sync, a first call) all come here: one
            # builds the adapter, the others use it (one replaced would never be closed).
            if server_id not in self.adapters:
                self.adapters[server_id] = adapter = adapter_for(server)
                adapter.spell(spelled)
                self.built_from[server_id] = settings_of(server)
        return self.adapters[server_id]

    def retire_stale_adapter(self, server: Server) -> None:
        """An operator's edit (URL, key, kind, …) reaches the worker with the next status
        sync: the next task builds a new adapter. Requests still on the old one finish
        there; it is closed when the worker stops."""
        if server.pk in self.adapters and self.built_from[server.pk] != settings_of(server):
            log.info("server %s was edited: connecting anew", server.name)
            self.retired.append(self.adapters.pop(server.pk))

    async def close_adapters(self) -> None:
        self.closed = True
        for adapter in [*self.adapters.values(), *self.retired]:
            await adapter.close()

    # -- publishing and hearing ----------------------------------------------------------

    async def open(self, news: Listener) -> None:
        """Publish this process's hints from the running loop; hear of news (wake-ups)."""
        await channel_hints.open_outbox()
        wakeup.subscribe(news)

    def stop_hearing(self, news: Listener) -> None:
        wakeup.unsubscribe(news)

    async def close(self) -> None:
        """Send the hints still queued, then stop publishing."""
        await channel_hints.close_outbox()

    def listeners(self, news: Listener) -> list[Coroutine[Any, Any, None]]:
        """What hears other processes' news (PostgreSQL's NOTIFY), to run beside the loop."""
        return [wakeup.listen_postgres(news)] if settings.IS_POSTGRES else []

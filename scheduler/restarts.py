"""A worker that loses the database starts its work again, in the same process.

A database fault (PostgreSQL restarting, a backend terminated, a failover) ends the
runtime: a task whose write failed cannot know what was kept, so the runtime stops as it
does on SIGTERM (the requests at their servers may finish within the drain). Its lease is
not carried on as if its commits were kept (a crash of PostgreSQL may lose the last ones):
as soon as the database answers, what the old lease still holds is handed back, as a
take-over does (a request at its server then runs again, and its trace says so), and the
worker starts again under a new lease. A line in the log each way, no traceback."""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from . import faults, store
from .runtime import Runtime, db

log = logging.getLogger("scheduler")
RETRY_S = 0.5  # between tries while the database does not answer


async def run_worker(
    stop: asyncio.Event,
    until_idle: bool = False,
    started: Callable[[Runtime], None] | None = None,
) -> None:
    """Runtimes, one after the other, until `stop` (or, with `until_idle`, until one is
    idle). `started` is told of each. A database fault after `stop` goes up as it came."""
    while True:
        runtime = Runtime()
        if started is not None:
            started(runtime)
        try:
            await runtime.run(stop, until_idle=until_idle)
            return
        except faults.DATABASE_FAULTS as error:
            if stop.is_set():
                raise
            log.warning(
                "worker %s lost the database (%s); starting again as soon as it answers",
                runtime.worker_id,
                faults.one_line(error),
            )
        if not await hand_back(runtime.worker_id, stop):
            return


async def hand_back(worker_id: int | None, stop: asyncio.Event) -> bool:
    """Once the database answers, hand back what the lost lease holds (nothing if the
    runtime stopped cleanly after all). False if `stop` came first."""
    while not stop.is_set():
        try:
            if worker_id is not None:
                moved, _ = await db(store.release_worker)(worker_id)
                log.warning(
                    "the database answers: %d request(s) of worker %s handed back", moved, worker_id
                )
            return True
        except faults.DATABASE_FAULTS:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RETRY_S):
                    await stop.wait()
    return False

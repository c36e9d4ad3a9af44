import asyncio
import logging
import signal

from django.core.management.base import BaseCommand
from django.db import InterfaceError, OperationalError

from config import event_loop
from scheduler.runtime import Runtime

log = logging.getLogger("scheduler")


class Command(BaseCommand):
    help = "Run the scheduling worker: route, load, unload and dispatch requests."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="Exit once a pass finds nothing to do and no task is running (for tests).",
        )

    def handle(self, *args, until_idle: bool = False, **options) -> None:
        try:
            event_loop.run(run_worker(until_idle))
        except (OperationalError, InterfaceError) as exc:
            # Not reconnected: a database that crashed took the commits of this worker that
            # did not wait for its disk (an answer stored, a request sent), so what it holds
            # must be taken over as a dead worker's is, and run again.
            log.error(
                "lost the database (%s); exiting. What this worker held is taken over once its"
                " lease is stale (SWITCHYARD_WORKER_STALE_S), by this worker restarted or"
                " by another, and runs again.",
                str(exc).strip(),
            )
            raise SystemExit(1) from exc


async def run_worker(until_idle: bool = False) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await Runtime().run(stop, until_idle=until_idle)

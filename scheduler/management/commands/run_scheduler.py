import asyncio
import logging
import signal

from django.core.management.base import BaseCommand
from django.db import InterfaceError, OperationalError

from config import event_loop
from dashboard.history import record_forever
from scheduler import faults, restarts
from scheduler.worker_health import WorkerHealth

log = logging.getLogger("scheduler")


class Command(BaseCommand):
    help = "Run the scheduling worker: route, load, unload and dispatch requests."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="Exit once a pass finds nothing to do and no task is running (for tests).",
        )
        parser.add_argument(
            "--health-port",
            type=int,
            help="Answer GET /healthz on this port: 200 while the loop is alive and a pass"
            " ended within twice the poll interval, else 503.",
        )
        parser.add_argument("--health-host", default="127.0.0.1")

    def handle(
        self,
        *args,
        until_idle: bool = False,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        **options,
    ) -> None:
        health = (health_host, health_port) if health_port is not None else None
        try:
            event_loop.run(run_worker(until_idle, health))
        except (OperationalError, InterfaceError) as exc:
            # Only once stopping (else it starts again): what this worker held is taken
            # over as a dead worker's is, and runs again.
            log.error(
                "lost the database (%s) while stopping; exiting. What this worker held is"
                " taken over once its lease is stale (SWITCHYARD_WORKER_STALE_S).",
                faults.one_line(exc),
            )
            raise SystemExit(1) from exc


async def run_worker(until_idle: bool = False, health: tuple[str, int] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watcher = WorkerHealth() if health else None
    serving = asyncio.create_task(watcher.serve(*health)) if watcher and health else None
    # The dashboard's history (load spans, per-minute figures, ETA checks) beside the loop:
    # a fixed cost per worker, none per open dashboard.
    history = asyncio.create_task(record_forever(stop), name="history")
    try:
        # A database fault starts the worker's work again (scheduler/restarts.py).
        await restarts.run_worker(stop, until_idle, watcher.follow if watcher else None)
    finally:
        stop.set()
        await history
        if serving is not None:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

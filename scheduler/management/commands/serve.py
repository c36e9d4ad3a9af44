"""The embedded mode: the web app and the scheduler in one process, one event loop."""

import asyncio
import logging

from daphne.endpoints import build_endpoint_description_strings
from django.core.management.base import BaseCommand

from config import event_loop
from config.asgi import application
from config.web import web_server_class
from dashboard.history import record_forever
from scheduler import restarts

log = logging.getLogger("scheduler")


class Command(BaseCommand):
    help = "Serve the web app and run the scheduler together (the embedded default)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-scheduler", action="store_true")

    def handle(self, *args, host: str, port: int, no_scheduler: bool, **options) -> None:
        stop = asyncio.Event()
        tasks: list[asyncio.Task] = []

        def start_scheduler() -> None:
            if not no_scheduler:
                loop = asyncio.get_event_loop()
                tasks.append(loop.create_task(restarts.run_worker(stop)))
                tasks.append(loop.create_task(record_forever(stop), name="history"))
            loop = event_loop.name(asyncio.get_event_loop())
            self.stdout.write(f"Switchyard is serving on http://{host}:{port}/ ({loop})")

        server = web_server_class()(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=start_scheduler,
            signal_handlers=True,
        )
        server.run()
        # The reactor has stopped; let the scheduler finish its stop (unregister the worker).
        stop.set()
        if tasks:
            asyncio.get_event_loop().run_until_complete(asyncio.wait(tasks, timeout=10))
        event_loop.exit_served()

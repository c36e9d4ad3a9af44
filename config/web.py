"""`python -m config.web [daphne's options] config.asgi:application`: a web process,
daphne on Switchyard's event loop (see `config.event_loop`). Plain `daphne` works too, on
asyncio's own loop."""

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from http import HTTPStatus

from config import event_loop

log = logging.getLogger("config.web")  # by name: run as __main__ too
WATCH_LINK = re.compile(r"(/watch/[^/:?\s]+:)[^/?\s]+")  # a request's id, then its key


def masked(request: str) -> str:
    """An access log's request line without the key of a watch link: who holds the link
    reads the answer, and a log shipped elsewhere must not hand it on."""
    return WATCH_LINK.sub(r"\1…", request)


def web_server_class() -> type:
    """Daphne's server, its access log masked, that drains as it stops (`web_stop`): the
    calls it holds may finish, for up to `SWITCHYARD_DRAIN_S`, and those it then cuts are
    not taken for callers hanging up. Daphne is imported only here: its server module
    installs a reactor of its own unless ours is installed first."""
    from daphne.access import AccessLogGenerator
    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol
    from django.conf import settings
    from twisted.internet import defer
    from twisted.web import http

    from scheduler.api import web_stop

    # Twisted knows no reason for some codes Switchyard answers (429): its status line read
    # "429 Unknown Status". Its public table takes the standard library's names.
    for status in HTTPStatus:
        http.RESPONSES.setdefault(status.value, status.phrase.encode())

    class AccessLog(AccessLogGenerator):
        def write_entry(self, host, date, request, *args, **kwargs) -> None:
            super().write_entry(host, date, masked(request), *args, **kwargs)

    class WebServer(Server):
        def __init__(self, *args, action_logger=None, **kwargs) -> None:
            if isinstance(action_logger, AccessLogGenerator):
                action_logger = AccessLog(action_logger.stream)
            super().__init__(*args, action_logger=action_logger, **kwargs)
            self.ports: list = []

        def listen_success(self, port) -> None:
            self.ports.append(port)
            super().listen_success(port)

        def kill_all_applications(self):
            # Called as the reactor stops (SIGTERM, SIGINT); it waits for what this returns.
            web_stop.begin_drain()
            for port in self.ports:
                port.stopListening()
            drained = asyncio.ensure_future(self.calls_answered(settings.SWITCHYARD["DRAIN_S"]))
            # Asked again (a second Ctrl-C): stop now, as after the drain.
            loop = asyncio.get_event_loop()
            for asked in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(asked, drained.cancel)
            waited = defer.Deferred.fromFuture(drained)
            waited.addBoth(lambda _: self.cut_calls())
            return waited

        def open_calls(self) -> list[asyncio.Future]:
            """The HTTP calls not yet answered (a websocket stays open until it is cut)."""
            return [
                call
                for protocol, details in self.connections.items()
                if not isinstance(protocol, WebSocketProtocol)
                and (call := details.get("application_instance")) is not None
                and not call.done()
            ]

        async def calls_answered(self, within_s: float) -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within_s
            if calls := self.open_calls():
                log.info(
                    "stopping: no new calls; %d open, given up to %.0f s to be answered"
                    " (SWITCHYARD_DRAIN_S)",
                    len(calls),
                    within_s,
                )
            while calls and (left_s := deadline - loop.time()) > 0:
                await asyncio.wait(calls, timeout=left_s)
                calls = self.open_calls()
            if calls:
                log.info(
                    "stopping: %d call(s) still open are told where their requests go on",
                    len(calls),
                )

        def cut_calls(self):
            web_stop.stop()
            return super().kill_all_applications()

    return WebServer


def web_command():
    """Daphne's command line, on `web_server_class`."""
    from daphne.cli import CommandLineInterface

    class WebCommand(CommandLineInterface):
        server_class = web_server_class()

    return WebCommand()


def main() -> None:
    loop = event_loop.install_reactor()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()  # the logging settings, for the line below
    log.info("web process on %s's event loop", event_loop.name(loop))
    web_command().run(sys.argv[1:])
    event_loop.exit_served()


if __name__ == "__main__":
    main()

"""`python -m config.web [daphne's options] config.asgi:application`: a web process,
daphne on Switchyard's event loop (see `config.event_loop`). Plain `daphne` works too, on
asyncio's own loop."""

import logging
import os
import re
import sys

from config import event_loop

WATCH_LINK = re.compile(r"(/watch/[^/:?\s]+:)[^/?\s]+")  # a request's id, then its key


def masked(request: str) -> str:
    """An access log's request line without the key of a watch link: who holds the link
    reads the answer, and a log shipped elsewhere must not hand it on."""
    return WATCH_LINK.sub(r"\1…", request)


def web_server_class() -> type:
    """Daphne's server, its access log masked, that stops without cancelling its callers'
    requests. Daphne is imported only here: its server module installs a reactor of its own
    unless ours is installed first."""
    from daphne.access import AccessLogGenerator
    from daphne.server import Server

    from scheduler.api.waiting import web_process_stopping

    class AccessLog(AccessLogGenerator):
        def write_entry(self, host, date, request, *args, **kwargs) -> None:
            super().write_entry(host, date, masked(request), *args, **kwargs)

    class WebServer(Server):
        def __init__(self, *args, action_logger=None, **kwargs) -> None:
            if isinstance(action_logger, AccessLogGenerator):
                action_logger = AccessLog(action_logger.stream)
            super().__init__(*args, action_logger=action_logger, **kwargs)

        def kill_all_applications(self):
            # Daphne cancels every open call as it stops: a restart, not callers hanging up.
            web_process_stopping()
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
    logging.getLogger("config.web").info("web process on %s's event loop", event_loop.name(loop))
    web_command().run(sys.argv[1:])
    event_loop.exit_served()


if __name__ == "__main__":
    main()

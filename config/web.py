"""`python -m config.web [daphne's options] config.asgi:application`: a web process,
daphne on Switchyard's event loop (see `config.event_loop`). Plain `daphne` works too, on
asyncio's own loop."""

import logging
import os
import sys

from config import event_loop


def main() -> None:
    loop = event_loop.install_reactor()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()  # the logging settings, for the line below
    logging.getLogger("config.web").info("web process on %s's event loop", event_loop.name(loop))

    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(sys.argv[1:])
    event_loop.exit_served()


if __name__ == "__main__":
    main()

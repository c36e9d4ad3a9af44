"""The event loop every Switchyard process runs on: uvloop's (libuv), unless
SWITCHYARD_EVENT_LOOP=asyncio asks for asyncio's own (for its debug mode, say), or uvloop is
not installed (it has no Windows build).

Measured by `manage.py bench overhead` on PostgreSQL + Redis (2 cores, three alternating
pairs of runs): CPU per request, web 3.06 -> 2.52 ms and worker 5.03 -> 4.24 ms.

Daphne makes the loop of Twisted's reactor when `daphne.server` is first imported, and
Django's app registry imports it (the `daphne` app). So `manage.py` and `python -m
config.web` install the reactor on our loop before anything else; daphne then keeps it.
"""

import asyncio
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

try:
    import uvloop
except ImportError:  # Windows
    uvloop = None

T = TypeVar("T")


def chosen() -> str:
    """`uvloop` or `asyncio`: what `new_event_loop` makes in this process."""
    if uvloop is None or os.environ.get("SWITCHYARD_EVENT_LOOP", "uvloop") == "asyncio":
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if chosen() == "uvloop" else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, on the chosen loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def install_reactor() -> asyncio.AbstractEventLoop:
    """Twisted's asyncio reactor, on a loop of ours (call before importing daphne). Also,
    for a process that seems stuck: `kill -USR1 <pid>` prints every thread's stack to its
    stderr and the process goes on."""
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    from twisted.internet import asyncioreactor

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
    return loop


def name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`, for the logs."""
    return "uvloop" if uvloop is not None and isinstance(loop, uvloop.Loop) else "asyncio"


def exit_served(code: int = 0) -> NoReturn:
    """End a web process once daphne's reactor has stopped, without joining request threads.

    Django runs a request's sync middleware in a thread that waits there for the async rest
    of the request on the loop. A SIGTERM that stops the loop mid-request leaves that thread
    waiting for a loop that will not run again, and Python's own exit joins it forever. Its
    connection is closed already and the request, if one was accepted, is stored: nothing
    is lost by not waiting."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Hints after commit: the channel layer tells web views and dashboards what moved.

The database is the truth; a listener that missed a hint re-reads it.
"""

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from . import faults
from .throttle import Throttle

log = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
DASHBOARD_CHANGED = {"type": "dashboard.changed"}
DASHBOARD_EVERY_S = 0.1


def request_group(request_id) -> str:
    return f"request-{request_id.hex if hasattr(request_id, 'hex') else request_id}"


async def send(group: str, message: dict[str, Any], *, one: bool = False) -> None:
    """To every listener in `group`; with `one`, to the one listener whose channel it names
    (a watch page that asked for what it missed)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if one:
            await layer.send(group, dict(message))
        else:
            await layer.group_send(group, dict(message))
    except faults.REDIS_FAULTS as exc:  # listeners re-read the truth meanwhile
        faults.REDIS.failed(exc, "sending a hint")
    except Exception:  # a hint that cannot be sent must never break a transition
        log.exception("could not send %s to %s", message.get("type"), group)
    else:
        faults.REDIS.works()


class Outbox:
    """Hints queued from the database thread and sent, in order, by a task on the event
    loop: a transition never waits on the channel layer. Dashboard hints go out at most
    every DASHBOARD_EVERY_S, the last always sent: a busy worker moves hundreds of
    requests a second, and a page redraws a few times a second at most."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.dashboard = Throttle(
            lambda: send(DASHBOARD_GROUP, DASHBOARD_CHANGED), DASHBOARD_EVERY_S
        )
        self.sender = loop.create_task(self.drain(), name="channel_hints")
        self.users = 1

    def put(self, group: str, message: dict[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (group, message))

    async def drain(self) -> None:
        while True:
            group, message = await self.queue.get()
            if group == DASHBOARD_GROUP and message == DASHBOARD_CHANGED:
                self.dashboard.hint()
            else:
                await send(group, message)
            self.queue.task_done()

    async def close(self) -> None:
        await self.queue.join()
        await self.dashboard.flush()
        self.sender.cancel()
        await asyncio.gather(self.sender, return_exceptions=True)


_lock = threading.Lock()
_outbox: Outbox | None = None


async def open_outbox() -> None:
    """Send this process's hints from the running loop (one loop per process; a second
    loop in the same process falls back to sending from the calling thread)."""
    global _outbox
    with _lock:
        if _outbox is None:
            _outbox = Outbox(asyncio.get_running_loop())
        elif _outbox.loop is asyncio.get_running_loop():
            _outbox.users += 1


async def close_outbox() -> None:
    """Send what is queued, then stop (when the last user of this loop's outbox leaves)."""
    global _outbox
    with _lock:
        outbox = _outbox
        if outbox is None or outbox.loop is not asyncio.get_running_loop():
            return
        outbox.users -= 1
        if outbox.users:
            return
        _outbox = None
    await outbox.close()


def send_from_sync(group: str, message: dict[str, Any]) -> None:
    outbox = _outbox
    if outbox is not None and not outbox.loop.is_closed():
        outbox.put(group, message)
    else:
        async_to_sync(send)(group, message)


def request_moved(request_id, state: str, outcome: dict[str, Any] | None = None) -> None:
    """Called on commit of a request's transition (from a sync thread). Its own group hears
    only of the end, carrying what the move wrote (result, error), so that its caller answers
    without reading the row again: no one waiting on a request acts on the steps between
    (its dashboard page follows the dashboard group, told of every move)."""
    if outcome is not None:
        send_from_sync(request_group(request_id), end_message(request_id, state, outcome))
    send_from_sync(DASHBOARD_GROUP, DASHBOARD_CHANGED)


def end_message(request_id, state: str, outcome: dict[str, Any] | None = None) -> dict[str, Any]:
    """The hint that a request ended (in `state`), with what its end wrote if given."""
    message = {"type": "request.moved", "id": str(request_id), "state": state}
    return message if outcome is None else message | {"outcome": outcome}


def dashboard_changed() -> None:
    send_from_sync(DASHBOARD_GROUP, DASHBOARD_CHANGED)

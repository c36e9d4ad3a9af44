"""Websockets for staff. Every message carries the full state, read after the commit that
sent the hint; hints in a burst are folded into one read (see `scheduler/throttle.py`)."""

import asyncio
import math
import threading
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.utils import timezone

from scheduler.channel_hints import DASHBOARD_GROUP, request_group
from scheduler.streams import ASKED, text_of
from scheduler.throttle import Throttle

from . import state
from .watch import watch_state
from .watch_tokens import request_id_for

REFUSED = 4403
NOT_FOUND = 4404


class StateConsumer(AsyncJsonWebsocketConsumer):
    """A page that is pushed its full state (`read_state`) as `message_type` after each hint
    from its groups, at most once per `push_interval_s`, the last always sent. `admit`
    says who may open it."""

    push_interval_s = 1.0
    message_type = ""

    async def admit(self) -> int | None:
        """None to accept the socket, else the close code that refuses it."""
        raise NotImplementedError

    def group_names(self) -> list[str]:
        raise NotImplementedError

    def read_state(self) -> dict | None:
        raise NotImplementedError

    async def connect(self) -> None:
        if (refused := await self.admit()) is not None:
            await self.close(code=refused)
            return
        self.throttle = Throttle(self.push, self.push_interval_s)
        for group in self.group_names():
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.throttle.hint()

    async def disconnect(self, code) -> None:
        if hasattr(self, "throttle"):
            self.throttle.close()
            for group in self.group_names():
                await self.channel_layer.group_discard(group, self.channel_name)

    async def push(self) -> None:
        current = await database_sync_to_async(self.read_state)()
        await self.send_json({"type": self.message_type, "state": current})

    async def dashboard_changed(self, message) -> None:
        self.throttle.hint()


class StaffConsumer(StateConsumer):
    # At most about four full-state reads a second per open page, the last always sent.
    push_interval_s = 0.25

    async def admit(self) -> int | None:
        user = self.scope.get("user")
        return None if user and user.is_authenticated and user.is_staff else REFUSED


class SharedRead:
    """One read of the overview for every page open in this process: a page pushed after
    a hint takes the state read since that hint by another page, if it is fresh. Twenty
    dashboards cost one read per hint, not twenty."""

    max_age_s = 0.5

    def __init__(self, read) -> None:
        self.read = read
        self.lock = threading.Lock()
        self.started = -math.inf
        self.value = None
        self.last_hint = -math.inf

    def hinted(self) -> None:
        self.last_hint = time.monotonic()

    def get(self):
        with self.lock:
            now = time.monotonic()
            if self.started >= self.last_hint and now - self.started < self.max_age_s:
                return self.value
            self.started, self.value = now, self.read()
            return self.value


shared_overview = SharedRead(state.overview)


class WorkerWatch:
    """A worker that dies sends no news, and the banner that says nothing schedules would
    wait for the next hint: while a dashboard is open in this process, the workers' rows are
    read every `every_s` (one small query), and a change of who is live or failing hints the
    dashboards."""

    every_s = 5.0

    def __init__(self) -> None:
        self.pages = 0
        self.task: asyncio.Task | None = None

    def opened(self) -> None:
        self.pages += 1
        running = self.task is not None and not self.task.done()
        if not running or self.task.get_loop() is not asyncio.get_running_loop():
            self.pages = 1  # a loop that ended took its pages with it
            self.task = asyncio.create_task(self.run())

    def closed(self) -> None:
        self.pages -= 1
        if self.pages <= 0 and self.task is not None:
            self.task.cancel()
            self.task = None

    async def run(self) -> None:
        seen = await database_sync_to_async(self.summary)()
        while True:
            await asyncio.sleep(self.every_s)
            now = await database_sync_to_async(self.summary)()
            if now != seen:
                await get_channel_layer().group_send(DASHBOARD_GROUP, {"type": "dashboard.changed"})
            seen = now

    @staticmethod
    def summary() -> tuple:
        workers = state.workers_state(timezone.now())
        return workers["live"], [f["id"] for f in workers["failing"]]


worker_watch = WorkerWatch()


class DashboardConsumer(StaffConsumer):
    message_type = "overview"

    def group_names(self) -> list[str]:
        return [DASHBOARD_GROUP]

    async def connect(self) -> None:
        # Its page was read just now: the first push must not be a shared read older than
        # that (a reload within `max_age_s` showed the state before the reload, until the
        # next hint).
        shared_overview.hinted()
        await super().connect()
        if hasattr(self, "throttle"):  # accepted
            worker_watch.opened()

    async def disconnect(self, code) -> None:
        if hasattr(self, "throttle"):
            worker_watch.closed()
        await super().disconnect(code)

    def read_state(self) -> dict:
        return shared_overview.get()

    async def dashboard_changed(self, message) -> None:
        shared_overview.hinted()
        self.throttle.hint()


class RequestConsumer(StaffConsumer):
    """One request's page; it also follows the dashboard group, because its place in line,
    its ETA and its model's load move when other rows do."""

    message_type = "request"

    def request_id(self):
        return self.scope["url_route"]["kwargs"]["request_id"]

    def group_names(self) -> list[str]:
        return [request_group(self.request_id()), DASHBOARD_GROUP]

    def read_state(self) -> dict | None:
        return state.request_detail(self.request_id())

    async def request_moved(self, message) -> None:
        self.throttle.hint()

    async def stream_chunk(self, message) -> None:
        """Tokens are for the caller, not the dashboard."""

    async def stream_asked(self, message) -> None:
        """A watch page's question, for the caller's relay."""


class WatchConsumer(StateConsumer):
    """A request's watch page, for whoever holds its signed URL (no login). Its state at
    most once a second (it follows the dashboard group, as its place moves when other rows
    do); a streamed answer's text as it comes."""

    message_type = "watch"

    async def admit(self) -> int | None:
        self.request_id = request_id_for(self.scope["url_route"]["kwargs"]["token"])
        return NOT_FOUND if self.request_id is None else None

    def group_names(self) -> list[str]:
        return [request_group(self.request_id), DASHBOARD_GROUP]

    def read_state(self) -> dict | None:
        return watch_state(self.request_id)

    async def request_moved(self, message) -> None:
        self.throttle.hint()

    async def connect(self) -> None:
        await super().connect()
        if hasattr(self, "throttle"):  # accepted: ask for what was written before it opened
            asked = {"type": ASKED, "id": str(self.request_id), "channel": self.channel_name}
            await self.channel_layer.group_send(request_group(self.request_id), asked)

    async def stream_chunk(self, message) -> None:
        """The text with where it begins in the answer (`at`): the page puts it after what
        it has, and drops what the start it asked for already held."""
        if text := text_of(message.get("chunks", [])):
            await self.send_json({"type": "chunk", "text": text, "at": message.get("at")})

    async def stream_asked(self, message) -> None:
        """Its own question (or another page's), heard in the request's group."""

    async def stream_start(self, message) -> None:
        """The answer so far, from the caller's relay."""
        await self.send_json({"type": "chunk", "text": message["text"], "at": 0})

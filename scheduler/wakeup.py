"""Wake the scheduler loop the moment there is something to do.

In one process an `asyncio.Event` per loop is set (thread-safe). Across processes on
PostgreSQL the writer's transaction runs `pg_notify`, which Postgres delivers only on commit,
and each worker LISTENs on its own connection.
"""

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from typing import NamedTuple

from django.conf import settings
from django.db import connection, connections

from . import sql
from .models import Request

CHANNEL = "switchyard"
NOTIFY = "SELECT pg_notify(%s, %s)"
ORIGIN_HEX = 8  # see origin_channel
log = logging.getLogger(__name__)


class Arrival(NamedTuple):
    """A new request, as its wake-up tells it: its class (what it may outrank), its model's
    name (where it may go at once; empty: nowhere, a pass decides) and its API key's id (0
    for none: within its class it may outrank another key's requests, see fair_share)."""

    priority: int
    request_id: uuid.UUID
    model: str
    api_key: int = 0
    cache_server: int = 0
    """The server its conversation's last turn ran on (0: none known); sent on arrival
    only there (`FastPaths.send_on_arrival`)."""

    def payload(self) -> str:
        return (
            f"{self.priority:d} {self.request_id.hex} {self.api_key:d} {self.cache_server:d}"
            f" {self.model}"
        )

    @classmethod
    def parse(cls, payload: str) -> "Arrival | None":
        """None for anything else (a NOTIFY sent by hand, say): news all the same."""
        parts = payload.split(" ", 4)
        if len(parts) != 5:
            return None
        priority, request_id, api_key, cache_server, model = parts
        try:
            return cls(
                int(priority), uuid.UUID(hex=request_id), model, int(api_key), int(cache_server)
            )
        except ValueError:
            return None


class Cancelled(NamedTuple):
    """A request cancelled while at its server: the worker serving it stops its call (the
    server stops generating when the connection closes)."""

    request_id: uuid.UUID

    PREFIX = "cancel "

    def payload(self) -> str:
        return f"{self.PREFIX}{self.request_id.hex}"


News = Arrival | Cancelled | None


def parse(payload: str) -> News:
    """A NOTIFY's news: an arrival, a cancel, or None for anything else (news all the same)."""
    if payload.startswith(Cancelled.PREFIX):
        try:
            return Cancelled(uuid.UUID(hex=payload.removeprefix(Cancelled.PREFIX)))
        except ValueError:
            return None
    return Arrival.parse(payload)


# Told of news: the request that arrived, the request cancelled, or None for other news.
Listener = Callable[[News], None]

_lock = threading.Lock()
_listeners: set[tuple[asyncio.AbstractEventLoop, Listener]] = set()


def subscribe(listener: Listener) -> None:
    with _lock:
        _listeners.add((asyncio.get_running_loop(), listener))


def unsubscribe(listener: Listener) -> None:
    with _lock:
        for entry in [e for e in _listeners if e[1] == listener]:
            _listeners.discard(entry)


def wake_local(arrived: News = None) -> None:
    with _lock:
        listeners = list(_listeners)
    for loop, listener in listeners:
        if not loop.is_closed():
            loop.call_soon_threadsafe(listener, arrived)


def notify_in_transaction(arrived: Arrival | None = None) -> None:
    """Call inside the transaction that made work (`arrived`: a new request, after its
    insert): other processes wake on its commit."""
    if arrived is None:
        notify_later(CHANNEL, "")
    else:
        # Only if its row was stored (an insert may find no model to store).
        [key] = sql.keys(Request, [arrived.request_id])
        stored = (f"EXISTS (SELECT 1 FROM {Request._meta.db_table} WHERE id = %s)", [key])
        notify_later(CHANNEL, arrived.payload(), only_if=stored)


def notify_later(channel: str, payload: str, only_if: sql.Statement | None = None) -> None:
    """On PostgreSQL, NOTIFY `channel` with the transaction's last writes (delivered on its
    commit), if the condition `only_if` then holds. The payload is bound as a value."""
    if not settings.IS_POSTGRES:
        return
    where, params = only_if or ("TRUE", [])
    sql.write_later(sql.prepared(f"{NOTIFY} WHERE {where}"), [channel, payload, *params])


def wake_workers(using: str = "default") -> None:
    """Wake every worker now, after a commit that gave them work (an operator's new server
    or deployment): this process's, and on PostgreSQL the others by NOTIFY."""
    wake_local()
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute(NOTIFY, [CHANNEL, ""])


def origin_channel(request_id: uuid.UUID) -> str:
    """The channel the web process that made `request_id` listens on for the ends of its
    requests: its ids end with ORIGIN_HEX hex digits of its own (see `api.inbox`)."""
    return f"{CHANNEL}_{request_id.hex[-ORIGIN_HEX:]}"


async def listen_postgres(listener: Listener) -> None:
    """Tell `listener` of every NOTIFY to the workers, reconnecting for as long as the
    worker runs; of None first each time (whatever arrived while not listening)."""

    def heard(payload: str | None) -> None:
        listener(None if payload is None else parse(payload))

    await listen(CHANNEL, heard)


async def listen(channel: str, heard: Callable[[str | None], None]) -> None:
    """Tell `heard` the payload of every NOTIFY on `channel`, and None each time the LISTEN
    begins, reconnecting for as long as this runs."""
    import psycopg

    db = connection.settings_dict  # the test database's name, under tests
    params = {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
    }
    params = {k: v for k, v in params.items() if v}
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
                await conn.execute(f"LISTEN {channel}")
                heard(None)
                async for note in conn.notifies():
                    heard(note.payload)
        except psycopg.OperationalError as exc:
            log.warning("LISTEN connection lost (%s); reconnecting in 1 s", exc)
            await asyncio.sleep(1)

"""Wake the scheduler loop the moment there is something to do.

In one process an `asyncio.Event` per loop is set (thread-safe). Across processes on
PostgreSQL the writer's transaction runs `pg_notify`, which Postgres delivers only on commit,
and each worker LISTENs on its own connection.
"""

import asyncio
import logging
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import connection

from . import sql

CHANNEL = "switchyard"
log = logging.getLogger(__name__)
# Told of news: with the class of the request that arrived, or None for other news.
Listener = Callable[[int | None], None]

_lock = threading.Lock()
_listeners: set[tuple[asyncio.AbstractEventLoop, Listener]] = set()


def subscribe(listener: Listener) -> None:
    with _lock:
        _listeners.add((asyncio.get_running_loop(), listener))


def unsubscribe(listener: Listener) -> None:
    with _lock:
        for entry in [e for e in _listeners if e[1] == listener]:
            _listeners.discard(entry)


def wake_local(arrived: int | None = None) -> None:
    with _lock:
        listeners = list(_listeners)
    for loop, listener in listeners:
        if not loop.is_closed():
            loop.call_soon_threadsafe(listener, arrived)


def notify_in_transaction(arrived: int | None = None) -> None:
    """Call inside the transaction that made work (`arrived`: a new request's class): other
    processes wake on its commit."""
    if settings.IS_POSTGRES:
        sql.write_later(
            f"NOTIFY {CHANNEL}" if arrived is None else f"NOTIFY {CHANNEL}, '{arrived:d}'"
        )


async def listen_postgres(listener: Listener) -> None:
    """Tell `listener` of every NOTIFY, reconnecting for as long as the worker runs."""
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
                await conn.execute(f"LISTEN {CHANNEL}")
                listener(None)  # whatever arrived while not listening
                async for note in conn.notifies():
                    # Anything but a class (sent by hand, say) is news all the same.
                    listener(int(note.payload) if note.payload.isdigit() else None)
        except psycopg.OperationalError as exc:
            log.warning("LISTEN connection lost (%s); reconnecting in 1 s", exc)
            await asyncio.sleep(1)

"""Transient faults of the database and Redis: telling them apart from bugs, saying once
that a service is down and once that it is back, and letting the connection pool find its
dead connections before a caller does."""

import logging
import threading
import time

import psycopg
from django.db import InterfaceError, OperationalError, connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)
# Django's wrappers, and psycopg's own (from connections Django does not hold: LISTEN).
DATABASE_FAULTS = (OperationalError, InterfaceError, psycopg.OperationalError)
REDIS_FAULTS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
POOL_CHECK_EVERY_S = 0.5


def one_line(error: BaseException) -> str:
    """An error's text on one line, for a log line (its type where it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def is_database_fault(exc: BaseException) -> bool:
    return isinstance(exc, DATABASE_FAULTS)


def is_transient(exc: BaseException) -> bool:
    """A service's fault (down, restarting, a connection cut), not a fault of ours."""
    return isinstance(exc, DATABASE_FAULTS + REDIS_FAULTS)


class Outage:
    """Whether a service is down, as this process last found it. Logged on each change
    only: an outage of 20 s is one line when it starts and one when it ends, not a
    traceback for every hint that could not be sent."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.down = False
        self.lock = threading.Lock()

    def failed(self, exc: BaseException, doing: str) -> None:
        with self.lock:
            if self.down:
                return
            self.down = True
        log.warning(
            "%s is down (%s while %s); carrying on without it until it is back",
            self.service,
            type(exc).__name__,
            doing,
        )

    def works(self) -> None:
        if not self.down:
            return
        with self.lock:
            if not self.down:
                return
            self.down = False
        log.warning("%s is back", self.service)


REDIS = Outage("Redis")
_checked_at = 0.0
_check_lock = threading.Lock()


def check_pool() -> None:
    """After a database fault (from a sync thread): drop this connection and have the pool
    test its idle ones, so that the next caller gets a live connection instead of finding
    a dead one by failing. At most every POOL_CHECK_EVERY_S: many callers fail at once."""
    global _checked_at
    connection.close_if_unusable_or_obsolete()
    if connection.in_atomic_block:
        return
    connection.close()
    pool = getattr(connection, "pool", None)
    if pool is None:
        return
    with _check_lock:
        if time.monotonic() - _checked_at < POOL_CHECK_EVERY_S:
            return
        _checked_at = time.monotonic()
    try:
        pool.check()
    except Exception as exc:  # still down: the next fault checks again
        log.info("checking the database pool's connections failed: %s", exc)


class QuietRedisFaults(logging.Filter):
    """channels-redis logs a traceback each time its reader fails to reach Redis (every
    second of an outage); such a failure is told once, by REDIS, instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and isinstance(exc, REDIS_FAULTS):
            REDIS.failed(exc, "receiving from the channel layer")
            return False
        return True


logging.getLogger("channels_redis.pubsub").addFilter(QuietRedisFaults())

"""Lock conflicts between workers: a deadlock or a serialization failure is retried, never
fatal.

Every writer takes its locks in one order (docs/architecture.md, "Lock order"): servers,
then deployments, then requests (each kind in id order). A conflict can still happen (a
worker taking over a stale one's rows, a row read by a stale plan): PostgreSQL then rolls
one transaction back, and that transaction is simply run again. Nothing it wrote stays."""

import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import connection
from django.db.utils import OperationalError

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
ATTEMPTS = 8  # a conflict that persists past these is a bug: it goes up as the error it is
BACKOFF_S = 0.005  # first pause, doubled each time, jittered (the other side finishes first)
# PostgreSQL's SQLSTATEs of a transaction rolled back because of another one.
CONFLICT_STATES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock not available


def is_conflict(error: BaseException) -> bool:
    """Whether `error` (or what it wraps) is a conflict with another transaction."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "sqlstate", None) in CONFLICT_STATES:
            return True
        if isinstance(seen, OperationalError) and "database is locked" in str(seen):
            return True  # SQLite's: another process holds its write lock past the timeout
        seen = seen.__cause__ or seen.__context__
    return False


def pause(attempt: int) -> float:
    return BACKOFF_S * (2**attempt) * random.uniform(0.5, 1.5)


def retried(fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, a whole unit of database work, run again when it loses a conflict (only at the
    outermost level: inside a caller's transaction the caller must retry, as its work was
    rolled back too)."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(ATTEMPTS):
            try:
                return fn(*args, **kwargs)
            except Exception as error:
                last = attempt == ATTEMPTS - 1
                if last or connection.in_atomic_block or not is_conflict(error):
                    raise
                name = getattr(fn, "__qualname__", repr(fn))
                log.info("%s lost a lock conflict with another worker; again (%s)", name, error)
                time.sleep(pause(attempt))  # in the database thread, never the loop
        raise AssertionError("unreachable")

    run.__wrapped__ = fn  # type: ignore[attr-defined]
    run.__name__ = getattr(fn, "__name__", "retried")
    run.__qualname__ = getattr(fn, "__qualname__", "retried")
    return run

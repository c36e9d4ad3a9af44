"""The worker's database thread.

Django keeps a connection per thread, and the worker's passes and writes run one at a time
on one connection: in this thread. A connection that met a database fault (a restart, a
terminated backend) goes back to the pool, which drops it: the next call gets a live one
instead of failing on the dead one."""

import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from . import conflicts, faults
from .pool_threads import in_executor

P = ParamSpec("P")
T = TypeVar("T")

_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-db")


def in_database_thread(fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`fn` as a coroutine function that runs it in the database thread."""
    return in_executor(_leaving_no_dead_connection(fn), _thread)


def _leaving_no_dead_connection(fn: Callable[P, T]) -> Callable[P, T]:
    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except faults.DATABASE_FAULTS as error:
            if not conflicts.is_conflict(error):  # a lost conflict's connection is fine
                faults.check_pool()
            raise

    return run

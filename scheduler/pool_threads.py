"""Database work in a thread of the shared pool that gives its connection back after."""

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

P = ParamSpec("P")
T = TypeVar("T")


def released(fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`fn` in a thread of the shared pool, then the connection goes back (to the pool, on
    PostgreSQL): a caller may wait minutes between reads, and waiting callers must not hold
    one connection each; the worker's occasional chores must not hold up its pass's thread.
    Not in the caller's own thread: `fn` is a whole unit of work, and a pool thread keeps
    its connection wrapper from one call to the next."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            if not connection.in_atomic_block:
                connection.close()

    return sync_to_async(run, thread_sensitive=False)

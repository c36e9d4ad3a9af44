"""Sync work (the ORM's) in threads, awaited from the event loop.

A hop to a thread is a plain `run_in_executor`. asgiref's `sync_to_async` does the same
behind a copy and restore of the caller's context vars, a shield and its checks for
deadlocks, at about twice the CPU (117 against 63 µs a hop on a 2-core machine), and every
request makes such hops on its path, in the web process and the worker alike. The work
sent here reads no context var: nothing of the caller's context is needed."""

import asyncio
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, ParamSpec, TypeVar

from django.db import connection

P = ParamSpec("P")
T = TypeVar("T")


def in_executor(
    fn: Callable[P, T], executor: Executor | None
) -> Callable[P, Coroutine[Any, Any, T]]:
    """`fn` as a coroutine function that runs it in `executor` (None: the loop's default).
    Cancelled before its thread picks it up, it never runs; after, it runs to its end."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        work = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(executor, work)

    return call


def in_pool_thread(fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`fn` in a thread of the loop's shared pool (its default executor: bounded, at
    min(32, cores + 4) threads), then the connection goes back (to the pool, on
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

    return in_executor(run, None)

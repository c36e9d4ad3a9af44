"""The worker's database thread.

Django keeps a connection per thread, and the worker's passes and writes run one at a time
on one connection: in this thread. A hop to it is a plain `run_in_executor`; asgiref's
`sync_to_async` does the same behind a copy and restore of the caller's context vars, a
shield and its checks for deadlocks, at about twice the CPU (117 against 63 µs a hop on
this machine), and a request costs the worker two hops (its pass, its completion). The
worker's database work reads no context var: nothing of the caller's context is needed.
"""

import asyncio
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-db")


def in_database_thread(fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`fn` as a coroutine function that runs it in the database thread."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        work = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(_thread, work)

    return call

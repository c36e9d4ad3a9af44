"""The worker's database thread.

Django keeps a connection per thread, and the worker's passes and writes run one at a time
on one connection: in this thread."""

from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from .pool_threads import in_executor

P = ParamSpec("P")
T = TypeVar("T")

_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-db")


def in_database_thread(fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`fn` as a coroutine function that runs it in the database thread."""
    return in_executor(fn, _thread)

"""Waiting on a fact another process makes true, with a deadline."""

import time
from collections.abc import Callable


def eventually(fact: Callable[[], object], timeout: float = 30.0, every_s: float = 0.05):
    """fact()'s first truthy value, asked again every `every_s` until `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := fact()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {fact}")
        time.sleep(every_s)
    return value

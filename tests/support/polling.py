"""Waiting on a fact another process makes true, with a deadline: such a process tells this
one nothing, so its effect (a row, a log line, a port, a server's state) is asked again."""

import time
from collections.abc import Callable


def eventually(
    fact: Callable[[], object], timeout: float = 30.0, what: str = "", every_s: float = 0.05
):
    """fact()'s first truthy value, asked again every `every_s` until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := fact()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout:.0f} s: {what or fact}")
        time.sleep(every_s)
    return value

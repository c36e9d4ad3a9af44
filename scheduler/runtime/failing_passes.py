"""A pass that raises does not stop the worker.

A bug in the policy, or a state of the rows it does not expect, would raise again on every
pass; stopping would hand back the requests at their servers (they run again from the
start) and a restarted worker would meet the same state. Instead the worker goes on serving
what it runs (its calls, loads and answers need no pass) and tries a pass again after 1 s,
2 s, 4 s… up to a minute, until one works. It says so: a traceback for the first failure,
one line for each after, its row's `failing_since` and `failing_error` (the admin, the
metric `switchyard_workers_failing`) and its health endpoint (503 `failing`). A database
fault is not this: it stops the runtime as before (`scheduler.restarts`)."""

import logging
from datetime import datetime

from ..faults import one_line

log = logging.getLogger("scheduler")

FIRST_RETRY_S = 1.0
LAST_RETRY_S = 60.0


class FailingPasses:
    def __init__(self) -> None:
        self.since: datetime | None = None  # the first of the failures in a row
        self.count = 0  # failures in a row
        self.error = ""  # the last, on one line

    def failed(self, error: BaseException, now: datetime) -> float:
        """Note a failed pass; the seconds to wait before the next try."""
        self.count += 1
        self.error = f"{type(error).__name__}: {one_line(error)}"[:500]
        retry_s = min(FIRST_RETRY_S * 2 ** (self.count - 1), LAST_RETRY_S)
        if self.since is None:
            self.since = now
            log.error(
                "a pass failed; the worker goes on serving what it runs and tries again in %.2g s",
                retry_s,
                exc_info=error,
            )
        else:
            log.error(
                "a pass failed again (%d in a row; %s); next try in %.2g s",
                self.count,
                self.error,
                retry_s,
            )
        return retry_s

    def worked(self, now: datetime) -> bool:
        """Note a pass that worked; True if it ends failures."""
        if self.since is None:
            return False
        log.warning(
            "passes work again, after %d failed over %.0f s",
            self.count,
            (now - self.since).total_seconds(),
        )
        self.since, self.count, self.error = None, 0, ""
        return True

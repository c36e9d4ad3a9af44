"""The queue bound: a new request is refused (429) while too many wait.

Counting the waiting rows costs as much as the queue is deep (about 40 ms at 100,000 on
PostgreSQL here), and far below the bound an exact figure changes nothing. So a count is
kept for a second while it, plus what this process accepted since, stays under half of
every bound that applies; nearer than that, each arrival counts afresh and the decision is
exact. Only other web processes' arrivals within that second go unseen: to overshoot, they
would have to exceed half the bound in one second.
"""

import threading
import time
from collections import Counter
from collections.abc import Callable

from django.conf import settings
from django.db.models import Count

from ..models import WAITING_STATES, Priority, Request
from .errors import ApiError

FRESH_S = 1.0
NEAR = 0.5  # the share of a bound from which every arrival counts afresh
Limit = tuple[int, str, set[int]]  # bound, what it covers (for the message), classes


class QueueBound:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()  # web views run on several threads
        self.waiting: Counter[int] = Counter()  # by priority, as last counted plus since
        self.counted_at = -float("inf")

    def admit(self, priority: int) -> None:
        """Raise `queue_full` if a request of `priority` must wait no more, else count it
        as waiting. Call inside the transaction that stores it. A batch's lines count
        against no bound: one call made them, and they must not lock interactive callers
        out."""
        knobs = settings.SWITCHYARD
        label = Priority(priority).label
        every: list[Limit] = [
            (knobs[f"MAX_QUEUE_{label.upper()}"], label, {priority}),
            (knobs["MAX_QUEUE"], "all", set(Priority)),
        ]
        limits = [limit for limit in every if limit[0]]
        if not limits:
            return
        with self.lock:
            stale = self.clock() - self.counted_at >= FRESH_S
            if stale or any(self.held(classes) >= bound * NEAR for bound, _, classes in limits):
                self.count()
            for bound, which, classes in limits:
                if self.held(classes) >= bound:
                    raise queue_full(bound, which)
            self.waiting[priority] += 1

    def withdraw(self, priority: int) -> None:
        """Count one admitted request of `priority` as not waiting after all."""
        with self.lock:
            self.waiting[priority] = max(self.waiting[priority] - 1, 0)

    def held(self, classes: set[int]) -> int:
        return sum(self.waiting[c] for c in classes)

    def count(self) -> None:
        rows = (
            Request.objects.filter(state__in=WAITING_STATES, in_batch=False)
            .values_list("priority")
            .annotate(n=Count("pk"))
            .order_by()
        )
        self.waiting = Counter(dict(rows))
        self.counted_at = self.clock()


def queue_full(limit: int, which: str) -> ApiError:
    return ApiError(
        429,
        f"The queue is full ({limit} waiting requests, {which} classes). Try again later.",
        type="rate_limit_error",
        code="queue_full",
        retry_after_s=5,
    )


queue_bound = QueueBound()

"""The queue bound counts the waiting requests only when the answer could be no: far below
the bound a count stays good for a second, near it every arrival counts afresh."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.api.errors import ApiError
from scheduler.api.queue_bound import FRESH_S, QueueBound
from scheduler.models import Priority, Request, State
from tests import factories

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def bound(clock: Clock) -> QueueBound:
    return QueueBound(clock)


def waiting(n: int, priority: int = Priority.NORMAL) -> None:
    """Requests another web process stored: this one has not seen them."""
    for _ in range(n):
        factories.request("m", priority=priority)


def arrive(bound: QueueBound, priority: int = Priority.NORMAL) -> None:
    """A request admitted and stored by this process."""
    bound.admit(priority)
    factories.request("m", priority=priority)


@contextmanager
def counting() -> Iterator[list[str]]:
    """The counts of waiting rows made inside the block."""
    counts: list[str] = []
    with CaptureQueriesContext(connection) as captured:
        yield counts
    counts += [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]


def refusal(bound: QueueBound, priority: int = Priority.NORMAL) -> ApiError:
    with pytest.raises(ApiError) as raised:
        bound.admit(priority)
    return raised.value


def test_far_below_the_bound_a_count_serves_for_a_second(bound, clock, knobs):
    knobs(MAX_QUEUE=100)
    with counting() as counts:
        arrive(bound)
        arrive(bound)
    assert len(counts) == 1
    clock.now += FRESH_S
    with counting() as counts:
        arrive(bound)
    assert len(counts) == 1


def test_after_a_second_it_counts_what_other_processes_stored(bound, clock, knobs):
    knobs(MAX_QUEUE=10)
    arrive(bound)
    waiting(9)
    arrive(bound)  # the count is fresh and far below: no look
    clock.now += FRESH_S
    assert refusal(bound).status == 429


def test_from_half_the_bound_every_arrival_counts(bound, knobs):
    knobs(MAX_QUEUE=4)
    waiting(1)
    arrive(bound)  # counted 1, now 2 of 4: half
    waiting(2)  # the queue is full, though this process saw 2
    with counting() as counts:
        error = refusal(bound)
    assert len(counts) == 1
    assert (error.status, error.code, error.retry_after_s) == (429, "queue_full", 5)
    assert "4 waiting requests, all classes" in error.message


def test_requests_that_stopped_waiting_free_their_places(bound, knobs):
    knobs(MAX_QUEUE=2)
    waiting(2)
    assert refusal(bound).status == 429
    Request.objects.update(state=State.COMPLETED)
    bound.admit(Priority.NORMAL)


def test_a_class_bound_counts_that_class_only(bound, knobs):
    knobs(MAX_QUEUE=100, MAX_QUEUE_BACKGROUND=2)
    waiting(5, Priority.NORMAL)
    waiting(2, Priority.BACKGROUND)
    assert "2 waiting requests, background classes" in refusal(bound, Priority.BACKGROUND).message
    bound.admit(Priority.NORMAL)


def test_with_no_bound_nothing_is_counted(bound, knobs):
    knobs(MAX_QUEUE=0)
    with counting() as counts:
        arrive(bound, Priority.INTERACTIVE)
    assert counts == []

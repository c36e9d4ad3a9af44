"""The worker's outbox: every request hint goes out, in order; dashboard hints are folded
so that a busy worker sends a few a second, and the last one is never lost."""

import asyncio

import pytest

from scheduler import channel_hints
from scheduler.channel_hints import DASHBOARD_CHANGED, DASHBOARD_EVERY_S, DASHBOARD_GROUP, Outbox
from scheduler.throttle import Throttle


class VirtualClock:
    """Time that moves only when the code under test sleeps: a slow machine cannot move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def sent(monkeypatch, clock) -> list[tuple[str, float]]:
    """What the outbox sends, by group, with the virtual time of sending."""
    record: list[tuple[str, float]] = []

    async def send(group: str, message: dict) -> None:
        record.append((group, clock.now))

    monkeypatch.setattr(channel_hints, "send", send)
    return record


def outbox_on(clock: VirtualClock) -> Outbox:
    outbox = Outbox(asyncio.get_running_loop())
    dashboard = outbox.dashboard
    outbox.dashboard = Throttle(dashboard.push, dashboard.interval_s, clock.time, clock.sleep)
    return outbox


def moves(outbox: Outbox, first: int, count: int) -> None:
    """What the database thread puts after committing `count` moves."""
    for i in range(first, first + count):
        outbox.put(f"request-{i}", {"type": "request.moved"})
        outbox.put(DASHBOARD_GROUP, DASHBOARD_CHANGED)


async def handed_over() -> None:
    """Until the loop has run what `put` handed it so far (its callbacks run in order)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon_threadsafe(done.set_result, None)
    await done


async def test_a_burst_of_moves_sends_each_request_hint_and_one_dashboard_hint(sent, clock):
    outbox = outbox_on(clock)
    moves(outbox, 0, 50)
    await handed_over()
    await outbox.close()
    groups = [group for group, _ in sent]
    assert groups == [f"request-{i}" for i in range(50)] + [DASHBOARD_GROUP]


async def test_dashboard_hints_keep_their_interval_and_the_last_is_sent_on_close(sent, clock):
    outbox = outbox_on(clock)
    moves(outbox, 0, 1)
    await handed_over()
    await outbox.queue.join()
    await outbox.dashboard.flush()  # the first goes out at once
    moves(outbox, 1, 20)  # within the interval: folded into one, sent after it
    await handed_over()
    await outbox.close()
    dashboard = [at for group, at in sent if group == DASHBOARD_GROUP]
    assert dashboard == [0.0, DASHBOARD_EVERY_S]
    assert len([group for group, _ in sent if group != DASHBOARD_GROUP]) == 21


async def test_a_timer_that_fires_early_does_not_shorten_the_interval(clock):
    """uvloop's timers may fire up to a millisecond early: the next push still waits until
    the whole interval has passed, so a page never gets more than one push an interval."""

    async def early(seconds: float) -> None:
        await clock.sleep(max(seconds - 0.001, 0.0005))

    pushed: list[float] = []

    async def push() -> None:
        pushed.append(clock.now)

    throttle = Throttle(push, 0.25, clock.time, early)
    for _ in range(5):
        throttle.hint()
        await throttle.flush()
    assert len(pushed) == 5
    assert all(b - a >= 0.25 - 1e-9 for a, b in zip(pushed, pushed[1:], strict=False))

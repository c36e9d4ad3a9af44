"""A server that others call directly too: an eviction lets the requests the server runs on
the victim that Switchyard did not send finish first (for up to `OUTSIDE_GRACE_S`), since
unloading it cuts them off; and the status sync sees a model they used as used. What the
server says it runs is the adapter's `activity` (llama.cpp's `/slots`), set here by hand on
a simulated server; against the real llama.cpp router:
tests/integration/test_real_llama_outside.py."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from backends.adapters.base import Activity
from backends.adapters.simulated import SimulatedAdapter, simulated_server
from backends.models import Deployment, DeploymentState, Server
from scheduler import store
from scheduler.models import State
from scheduler.runtime import Runtime, server_tasks
from tests import factories
from tests.support.running import (  # noqa: F401 (fixture)
    Running,
    db_thread_closed,
    deployment_state,
    loaded_on,
    state_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


@pytest.fixture
def outside(monkeypatch) -> dict[str, int]:
    """What the simulated server says it runs of each model that Switchyard did not send."""
    counts: dict[str, int] = {}

    async def running(adapter, server_model_id: str) -> int:
        return counts.get(server_model_id, 0)

    monkeypatch.setattr(SimulatedAdapter, "running", running)
    return counts


def theirs_loaded_on_a_one_model_server() -> None:
    """s1 holds one model: `theirs` is loaded there (with an idle TTL), `ours` is not."""
    s1 = factories.server("s1", max_llm=1)
    factories.deployment(s1, "theirs", idle_ttl_s=86_400)
    factories.deployment(s1, "ours")
    loaded_on("s1", "theirs")


def said(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


async def test_an_eviction_lets_requests_it_did_not_send_finish_first(outside, caplog):
    await db(theirs_loaded_on_a_one_model_server)()
    outside["theirs"] = 1
    ours = await db(factories.request)("ours")
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            waiting = "s1 first lets 1 request(s) on theirs that Switchyard did not send finish"
            await running.until(lambda: said(caplog, waiting))
            assert simulated_server("s1").loaded == {"theirs"}  # not cut off
            outside["theirs"] = 0
            await running.until(lambda: state_of(ours) == State.COMPLETED)
    assert simulated_server("s1").loaded == {"ours"}
    assert not said(caplog, "cuts off")
    # The wait (at least one look again, OUTSIDE_POLL_S) is no part of the load's own time,
    # which ETAs and the policy's prices read.
    load_s = await db(lambda: Deployment.objects.get(model__name="ours").avg_load_s)()
    assert load_s < server_tasks.OUTSIDE_POLL_S


async def test_requests_it_did_not_send_are_cut_off_after_the_grace(outside, caplog, knobs):
    knobs(OUTSIDE_GRACE_S=0.2)
    await db(theirs_loaded_on_a_one_model_server)()
    outside["theirs"] = 1  # and so it stays
    ours = await db(factories.request)("ours")
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            await running.until(lambda: state_of(ours) == State.COMPLETED)
    assert said(caplog, "unloading theirs from s1 for ours cuts off 1 request(s)")


async def test_a_load_nobody_waits_for_any_more_is_called_off_before_it_evicts(outside, caplog):
    """The one request for `ours` is cancelled while its load waits for a request that
    Switchyard did not send on `theirs`: the load is called off, `theirs` stays loaded for
    its user, and nothing is left `loading` or `unloading`. Without, `theirs` was unloaded
    under that user (after the grace) for a model nobody wanted any more."""
    await db(theirs_loaded_on_a_one_model_server)()
    outside["theirs"] = 1  # and so it stays
    ours = await db(factories.request)("ours")
    waiting = "s1 first lets 1 request(s) on theirs that Switchyard did not send finish"
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            await running.until(lambda: said(caplog, waiting))
            assert await db(store.cancel_request)(ours.pk, "the app gave up")
            await running.until(lambda: said(caplog, "called off the load of ours on s1"))
    assert simulated_server("s1").loaded == {"theirs"}
    assert await db(deployment_state)("theirs") == DeploymentState.LOADED
    assert await db(deployment_state)("ours") == DeploymentState.UNLOADED
    assert not said(caplog, "cuts off")


async def test_a_server_that_cannot_say_in_time_holds_no_eviction(monkeypatch):
    """A server whose `/slots` never answers (a hung model process) holds an eviction for
    ASK_TIMEOUT_S at most: it cannot say, and the victim is unloaded. Without the bound,
    the load waited for the adapter's read timeout (minutes, for inference)."""

    async def never(adapter, server_model_id: str) -> int:
        await asyncio.Event().wait()
        return 0

    monkeypatch.setattr(SimulatedAdapter, "running", never)
    monkeypatch.setattr(server_tasks, "ASK_TIMEOUT_S", 0.05)
    await db(theirs_loaded_on_a_one_model_server)()
    ours = await db(factories.request)("ours")
    async with Running() as running:
        await running.until(lambda: state_of(ours) == State.COMPLETED)
    assert simulated_server("s1").loaded == {"ours"}


class Slots:
    """What the simulated server's `activity` says, in turn, and whom it was asked of."""

    def __init__(self) -> None:
        self.said: list[Activity] = []
        self.asked: list[str] = []


@pytest.fixture
def slots(monkeypatch) -> Slots:
    seen = Slots()

    async def activity(adapter, server_model_id: str) -> Activity:
        seen.asked.append(server_model_id)
        return seen.said.pop(0)

    monkeypatch.setattr(SimulatedAdapter, "activity", activity)
    monkeypatch.setattr(SimulatedAdapter, "tells_activity", True)
    return seen


@contextlib.asynccontextmanager
async def syncing() -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """One worker's status sync of s1, as often as called (what it saw is remembered)."""
    server_id = await db(lambda: Server.objects.get(name="s1").pk)()
    runtime = Runtime()
    try:
        yield lambda: runtime.server_tasks.sync_server(server_id)
    finally:
        await runtime.effects.close_adapters()


async def test_the_status_sync_sees_a_model_used_by_others(slots):
    """The server's last task id on `theirs` moves between two syncs, or a request runs
    there: it counts as used at that sync (its idle TTL starts again; it is the last to be
    evicted), though Switchyard sent it nothing. The first look only learns the id. `ours`,
    loaded with no idle TTL, is not asked (asking keeps llama-server from its own sleep)."""
    slots.said = [Activity(0, 5), Activity(0, 5), Activity(0, 6), Activity(1, 6)]
    long_ago = timezone.now() - timedelta(hours=1)

    def last_used_then_reset():
        """Its last use, then set an hour back (and its load: a sync corrects only what
        was settled when it asked)."""
        theirs = Deployment.objects.filter(model__name="theirs")
        seen = theirs.get().last_used_at
        theirs.update(last_used_at=long_ago, state_changed_at=long_ago)
        return seen

    await db(theirs_loaded_on_a_one_model_server)()
    await db(loaded_on)("s1", "ours")
    await db(last_used_then_reset)()
    async with syncing() as sync:
        for used in (False, False, True, True):
            before = timezone.now()
            await sync()
            seen = await db(last_used_then_reset)()
            assert (seen > before) if used else (seen == long_ago)
    assert slots.asked == ["theirs"] * 4


async def test_the_status_sync_keeps_a_fresh_load_fresh_and_each_load_apart(slots):
    """A load of ours that no request of ours has used yet stays unused, whatever the
    server ran on it (the policy keeps it for the requests that waited for it: no wasted
    load). A new load's task ids start again: they are not weighed against the last."""
    slots.said = [Activity(0, 5), Activity(0, 6), Activity(0, 0)]
    hour_ago, now = timezone.now() - timedelta(hours=1), timezone.now()
    await db(theirs_loaded_on_a_one_model_server)()
    theirs = Deployment.objects.filter(model__name="theirs")

    def loaded(at, used):
        theirs.update(loaded_at=at, last_used_at=used, state_changed_at=hour_ago)

    await db(loaded)(hour_ago, hour_ago)  # loaded for requests, none sent to it yet
    async with syncing() as sync:
        for _ in range(2):
            await sync()  # 5, then 6
            assert await db(lambda: theirs.get().last_used_at)() == hour_ago
        used = now - timedelta(seconds=20)
        await db(loaded)(now - timedelta(seconds=30), used)  # loaded again, and used once
        await sync()  # 0 of the new load
        assert await db(lambda: theirs.get().last_used_at)() == used

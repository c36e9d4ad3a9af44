"""Restore on idle, end to end on a simulated server (a kind that can stop a load): what we
evicted for a normal request comes back once the server is idle, and a real request stops
a restore under way. The rule itself: test_policy_restore.py."""

import pytest
from asgiref.sync import sync_to_async

from backends.models import Deployment, DeploymentState
from scheduler.models import Priority, State
from tests import factories
from tests.support.running import (  # noqa: F401 (fixture)
    Running,
    db_thread_closed,
    deployment_state,
    state_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


def displaced(model: str) -> bool:
    return Deployment.objects.values_list("displaced", flat=True).get(model__name=model)


def one_server(*others: str):
    """s1 (one slot, one LLM): `chat` (0.5 s to load), `batch` and `others` (0.05 s); an
    interactive request for `chat`."""
    s1 = factories.server("s1", slots=1)
    factories.deployment(s1, "chat", load_s=0.5)
    for name in ("batch", *others):
        factories.deployment(s1, name, load_s=0.05)
    return factories.request("chat", Priority.INTERACTIVE)


async def test_an_idle_server_loads_back_what_a_normal_request_evicted(knobs):
    """`chat` (0.5 s to load) served an interactive request, then a normal request for
    `batch` (0.05 s) evicted it. Once `batch` is done and the server idle, `chat` is loaded
    back, evicting `batch`: the next person waits for nothing. Breaks if evicted models
    stay out until someone asks again."""
    knobs(MIN_RESIDENCY_S=0, NORMAL_WARM_WINDOW_S=0)
    first = await db(one_server)()
    async with Running() as running:
        await running.until(lambda: state_of(first) == State.COMPLETED)
        second = await db(factories.request)("batch", Priority.NORMAL)
        await running.until(lambda: state_of(second) == State.COMPLETED)
        await running.until(lambda: deployment_state("chat") == DeploymentState.LOADED)
        assert await db(deployment_state)("batch") == DeploymentState.UNLOADED
        assert await db(displaced)("batch")  # evicted to make room: it may come back too
        assert not await db(displaced)("chat")


async def test_a_request_stops_a_restore_under_way(knobs):
    """A restore of `chat` that would take 600 s is under way when a request for `other`
    arrives: the restore stops at once and `other` loads. Breaks if a guess held the
    server's one load channel."""
    knobs(MIN_RESIDENCY_S=0, NORMAL_WARM_WINDOW_S=0)
    first = await db(one_server)("other")
    async with Running() as running:
        await running.until(lambda: state_of(first) == State.COMPLETED)
        # From now on `chat` loads for 600 s: its restore is still under way below.
        await db(Deployment.objects.filter(model__name="chat").update)(
            load_options={"load_seconds": 600, "tokens_per_second": 10_000}
        )
        second = await db(factories.request)("batch", Priority.NORMAL)
        await running.until(lambda: state_of(second) == State.COMPLETED)
        await running.until(lambda: deployment_state("chat") == DeploymentState.LOADING)
        third = await db(factories.request)("other", Priority.NORMAL)
        await running.until(lambda: state_of(third) == State.COMPLETED)
        assert await db(deployment_state)("chat") != DeploymentState.LOADED

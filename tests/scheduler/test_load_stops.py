"""A load nobody waits for gives way (`StopLoad`): the worker stops it on a simulated server
so that a load somebody waits for starts at once, and the races around a stop (the load
that ends as it is stopped, an unload that fails). The rule itself: test_policy_stops.py;
against the real llama.cpp router: tests/integration/test_real_llama_router.py."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.base import AdapterError, ErrorCode
from backends.adapters.simulated import SimulatedAdapter, simulated_server
from backends.models import Deployment, DeploymentState
from scheduler import store
from scheduler.api import jobs
from scheduler.models import MetricEvent, State
from tests import factories
from tests.support.running import (  # noqa: F401 (fixture)
    Running,
    db_thread_closed,
    state_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState
LONG_LOAD_S = 600  # a load that never ends within a test unless it is stopped


def one_server_two_models():
    """s1 holds one model: `slow` (a load that never ends) and `fast`; a request for `slow`."""
    s1 = factories.server("s1", max_llm=1)
    factories.deployment(s1, "slow", load_s=LONG_LOAD_S)
    factories.deployment(s1, "fast")
    return factories.request("slow")


def deployment(model: str) -> Deployment:
    return Deployment.objects.get(model__name=model)


async def orphan_a_load(running: Running, slow) -> None:
    """`slow`'s load under way, then its only request cancelled: nobody waits for it."""
    await running.until(lambda: deployment("slow").state == DS.LOADING)
    await db(jobs.cancel)(slow.pk, None)


async def test_a_load_nobody_waits_for_gives_way_to_one_somebody_does(caplog):
    slow = await db(one_server_two_models)()
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            await orphan_a_load(running, slow)
            fast = await db(factories.request)("fast")
            await running.until(lambda: state_of(fast) == State.COMPLETED)
            stopped = await db(deployment)("slow")
            assert not running.runtime.effects.running("load slow@s1")  # its task cancelled
    assert simulated_server("s1").loaded == {"fast"}
    assert stopped.state == DS.UNLOADED and stopped.worker_id is None
    # Stopped, not failed: no retry's backoff, no error, and no load counted.
    assert (stopped.load_failures, stopped.next_load_at, stopped.last_error) == (0, None, "")
    said = [r.getMessage() for r in caplog.records]
    assert "stopped the load of slow on s1: gives way to a load of fast" in said
    assert not any(m.startswith("loading slow") and "failed" in m for m in said)


async def test_a_load_somebody_still_waits_for_is_not_stopped():
    """Two requests for `slow`, one cancelled: the other still waits for the load, and a
    request for `fast` waits its turn."""
    slow = await db(one_server_two_models)()
    also_slow = await db(factories.request)("slow")
    async with Running() as running:
        await orphan_a_load(running, slow)
        fast = await db(factories.request)("fast")
        await running.passes(3)
        assert await db(state_of)(fast) == State.PENDING
        assert await db(state_of)(also_slow) == State.NEEDS_LOADING
        assert (await db(deployment)("slow")).state == DS.LOADING


async def test_a_stop_whose_unload_fails_asks_the_server(monkeypatch, caplog):
    """The server does not say it stopped: it is asked what it holds (`recheck`), so the
    deployment never stays `unloading`, and the next load starts."""
    real_unload = SimulatedAdapter.unload

    async def refusing(self, server_model_id: str) -> None:
        if server_model_id == "slow":
            raise AdapterError(ErrorCode.SERVER_ERROR, "no")
        await real_unload(self, server_model_id)

    monkeypatch.setattr(SimulatedAdapter, "unload", refusing)
    slow = await db(one_server_two_models)()
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            await orphan_a_load(running, slow)
            fast = await db(factories.request)("fast")
            await running.until(lambda: state_of(fast) == State.COMPLETED)
    assert (await db(deployment)("slow")).state == DS.UNLOADED
    said = [r.getMessage() for r in caplog.records]
    assert "stopping the load of slow on s1 failed: no" in said


# -- the store's side of the races ------------------------------------------------------------


def a_load_under_way() -> tuple[store.LoadJob, int]:
    one_server_two_models()
    worker_id = store.register_worker()
    job = store.start_load(deployment("slow").pk, (), worker_id, "test")
    assert job is not None
    return job, worker_id


def test_a_stop_claims_only_a_load_this_worker_holds():
    job, worker_id = a_load_under_way()
    other = store.register_worker()
    assert store.stop_load(job.deployment_id, other) is None
    assert deployment("slow").state == DS.LOADING
    assert not MetricEvent.objects.filter(kind="load_stopped").exists()
    stop = store.stop_load(job.deployment_id, worker_id)
    assert stop == store.StopJob(job.deployment_id, job.server_id, "s1", "slow", "slow")
    assert MetricEvent.objects.filter(kind="load_stopped", model="slow").count() == 1
    d = deployment("slow")
    assert (d.state, d.worker_id) == (DS.UNLOADING, worker_id)


def test_a_load_that_ended_before_the_stop_is_not_stopped():
    """The load finished first: the stop is dropped (the next pass sees a loaded model)."""
    job, worker_id = a_load_under_way()
    store.load_succeeded(job, 1.0)
    assert store.stop_load(job.deployment_id, worker_id) is None
    assert deployment("slow").state == DS.LOADED


def test_a_load_that_ends_after_the_stop_stays_stopped():
    """The stop came first: the load's end does not turn `unloading` back into `loaded`,
    nor does a failure count against the model; the stop's unload then ends it."""
    job, worker_id = a_load_under_way()
    assert store.stop_load(job.deployment_id, worker_id) is not None
    store.load_succeeded(job, 1.0)
    assert deployment("slow").state == DS.UNLOADING
    store.load_failed(job, AdapterError(ErrorCode.LOAD_FAILED, "exit code 1"))
    d = deployment("slow")
    assert (d.state, d.load_failures, d.loaded_at) == (DS.UNLOADING, 0, None)
    store.evicted(job.deployment_id)
    assert deployment("slow").state == DS.UNLOADED


def test_the_store_keeps_who_asked_for_a_load_and_what_was_displaced():
    """`load_cause` tells the policy a restore (which gives way and keeps no residency) from
    an operator's load (which does neither); `displaced` marks only what a load evicted to
    make room, the only models a restore brings back."""
    one_server_two_models()
    worker_id = store.register_worker()
    job = store.start_load(deployment("slow").pk, (), worker_id, "test", "operator")
    assert deployment("slow").load_cause == "operator"
    store.load_succeeded(job, 1.0)
    store.evicted(job.deployment_id, to_make_room=True)
    assert deployment("slow").displaced
    job = store.start_load(deployment("slow").pk, (), worker_id, "test", "restore")
    assert (deployment("slow").load_cause, deployment("slow").displaced) == ("restore", False)
    assert MetricEvent.objects.filter(kind="restore", model="slow").count() == 1
    store.load_succeeded(job, 1.0)
    store.evicted(job.deployment_id)  # an operator's unload, an idle TTL
    assert not deployment("slow").displaced


def test_a_loads_progress_figure_goes_with_its_model():
    """A finished load leaves its deployment at 1.0; once that model leaves (evicted by a
    load, unloaded, gone from the server) the figure goes too: the operator API shows it."""
    one_server_two_models()
    worker_id = store.register_worker()
    job = store.start_load(deployment("slow").pk, (), worker_id, "test")
    store.load_succeeded(job, 1.0)
    assert deployment("slow").load_progress == 1.0
    job = store.start_load(deployment("fast").pk, (deployment("slow").pk,), worker_id, "test")
    assert (deployment("slow").state, deployment("slow").load_progress) == (DS.UNLOADING, None)
    store.evicted(deployment("slow").pk)
    store.load_succeeded(job, 1.0)
    assert store.start_unload(deployment("fast").pk, worker_id) is not None
    assert deployment("fast").load_progress is None

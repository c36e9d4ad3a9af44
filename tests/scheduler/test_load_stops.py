"""A load nobody waits for gives way (`StopLoad`): the store's side of a stop and its races
(the load that ends as it is stopped)."""

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.base import AdapterError, ErrorCode
from backends.models import Deployment, DeploymentState
from scheduler import store
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
    stop = store.stop_load(job.deployment_id, worker_id)
    assert stop == store.StopJob(job.deployment_id, job.server_id, "s1", "slow", "slow")
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

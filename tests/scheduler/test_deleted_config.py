"""A deployment or a model deleted while requests wait for it (the admin's delete,
`apply_config --prune`): the database clears the requests' links, and the next pass reads
them so. What waited on a deleted deployment is routed again; what asked for a deleted model
fails as a model that does not exist. Both once crashed every worker's pass (KeyError). A
load, an unload or a probe whose rows go while it runs ends quietly."""

import logging

import pytest
from django.utils import timezone

from backends.adapters.base import AdapterError, ErrorCode
from backends.models import Deployment, Model
from scheduler import store
from scheduler.api.inference import error_of
from scheduler.decisions import Fail, Requeue, Route
from scheduler.models import Request, State
from scheduler.policy import plan
from scheduler.store import SnapshotReader, policy_config
from tests import factories

pytestmark = pytest.mark.django_db


def routed_to(deployment: Deployment, state: str) -> Request:
    return factories.request(
        deployment.model.name, state=state, deployment=deployment, server=deployment.server
    )


def test_what_waited_on_a_deleted_deployment_is_routed_to_another_server():
    gone = factories.deployment(factories.server("a"), "m", state="loaded")
    kept = factories.deployment(factories.server("b"), "m", state="loaded")
    waiting = [routed_to(gone, State.READY), routed_to(gone, State.NEEDS_LOADING)]
    gone.delete()
    assert {r.deployment_id for r in Request.objects.all()} == {None}

    decisions = plan(SnapshotReader().read(policy_config()), timezone.now())
    assert {d.request_id for d in decisions if isinstance(d, Requeue)} == {r.pk for r in waiting}
    assert {(d.request_id, d.deployment_id) for d in decisions if isinstance(d, Route)} == {
        (r.pk, kept.pk) for r in waiting
    }


def test_what_asked_for_a_deleted_model_fails_as_not_found():
    d = factories.deployment(factories.server("a"), "m", state="loading")
    waiting = [routed_to(d, State.NEEDS_LOADING), factories.request("m")]
    Model.objects.filter(name="m").delete()

    decisions = plan(SnapshotReader().read(policy_config()), timezone.now())
    fails = [d for d in decisions if isinstance(d, Fail)]
    assert {f.request_id for f in fails} == {r.pk for r in waiting}
    assert {(f.code, f.message) for f in fails} == {
        ("model_not_found", "its model was deleted while it waited")
    }
    failed = Request(state=State.FAILED, error_code=fails[0].code, error=fails[0].message)
    error = error_of(failed)
    assert (error.status, error.type, error.code) == (
        404,
        "invalid_request_error",
        "model_not_found",
    )


def test_a_load_whose_deployment_is_deleted_meanwhile_ends_quietly(caplog):
    """An operator deletes a deployment (or its server) while its load runs, for seconds or
    minutes: the load's end, whichever, finds no row, says so, and the worker goes on (a
    missing row crashed the load's task, and with it the worker)."""
    caplog.set_level(logging.INFO, logger="scheduler")
    srv = factories.server("gpu-a")
    d = factories.deployment(srv, "m")
    idle = factories.deployment(srv, "n", state="loaded")
    job = store.start_load(d.pk, (), None, "a test")
    assert job is not None
    srv.delete()

    store.load_succeeded(job, 2.0)
    store.load_failed(job, AdapterError(ErrorCode.LOAD_FAILED, "out of memory"))
    assert "m loaded on gpu-a, whose deployment was deleted meanwhile" in caplog.text
    assert "m failed to load on gpu-a, whose deployment was deleted meanwhile" in caplog.text
    # And the other steps a pass or a task may take on rows gone since it read them.
    assert store.start_load(d.pk, (), None, "a test") is None
    assert store.start_unload(idle.pk, 0) is None
    assert store.stop_load(d.pk, 0) is None
    assert store.server_of_deployment(d.pk) is None
    store.evicted(idle.pk, to_make_room=True)
    store.recheck_deployment(d.pk, None)
    store.server_failed(srv.pk, "refused")
    store.probe_result(srv.pk, None)
    assert store.server_for_adapter(srv.pk) is None

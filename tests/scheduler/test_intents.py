"""Operators' intents as the loop plans them: pure, on hand-built snapshots."""

import json

import pytest

from backends.models import Deployment
from scheduler import store
from scheduler.asking import ask_load, record
from scheduler.decisions import StartLoad, Unload
from scheduler.intents import IntentView, Step, plan_intents, write_step
from scheduler.models import Intent, Worker
from scheduler.store.dispatch import _loaded
from tests import factories
from tests.scheduler.builders import T0, dep, server, snap


def intent(id, action, deployment_id=None, status="pending", server_id=1, reason="asked"):
    return IntentView(id, action, server_id, deployment_id, status, True, reason)


def test_a_load_evicts_an_idle_model_as_the_policy_would():
    s = snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [])
    [step] = plan_intents(s, [intent(7, "load", 2)], T0)
    assert step.decision == StartLoad(2, (1,), "operator intent 7", "operator")
    assert (step.status, step.reason) == ("running", "load started, evicting a")


def test_a_load_never_evicts_a_busy_model_it_waits_and_a_pinned_one_fails_it():
    for victim, status in [
        (dep(1, 1, "a", "loaded", in_flight=1), "pending"),
        (dep(1, 1, "a", "loaded", pinned=True), "failed"),
    ]:
        s = snap([server(1)], [victim, dep(2, 1, "b")], [])
        [step] = plan_intents(s, [intent(7, "load", 2)], T0)
        assert step.decision is None
        assert step.status == status and step.reason.startswith("no room")


def test_one_load_at_a_time_per_server():
    s = snap([server(1, llm=2)], [dep(1, 1, "a", "loading"), dep(2, 1, "b")], [])
    [step] = plan_intents(s, [intent(7, "load", 2)], T0)
    assert (step.decision, step.status, step.reason) == (None, "pending", "waiting: a is loading")


def test_a_busy_model_is_unloaded_once_its_requests_finish():
    busy = snap([server(1)], [dep(1, 1, "a", "loaded", in_flight=2)], [])
    [step] = plan_intents(busy, [intent(7, "unload", 1)], T0)
    assert (step.decision, step.reason) == (None, "waiting for its requests to finish")
    # Nothing new to say: no step, no trace row.
    waiting = intent(7, "unload", 1, reason="waiting for its requests to finish")
    assert plan_intents(busy, [waiting], T0) == []
    idle = snap([server(1)], [dep(1, 1, "a", "loaded")], [])
    [step] = plan_intents(idle, [waiting], T0)
    assert step.decision == Unload(1, "operator intent 7")


def test_a_running_intent_ends_with_its_deployment():
    loaded = snap([server(1)], [dep(1, 1, "a", "loaded")], [])
    [step] = plan_intents(loaded, [intent(7, "load", 1, status="running")], T0)
    assert (step.status, step.reason) == ("done", "loaded")
    failed = snap([server(1)], [dep(1, 1, "a", "failed", last_error="no file")], [])
    [step] = plan_intents(failed, [intent(7, "load", 1, status="running")], T0)
    assert (step.status, step.reason) == ("failed", "the load failed: no file")
    gone = snap([server(1)], [dep(1, 1, "a", "unloaded")], [])
    [step] = plan_intents(gone, [intent(8, "unload", 1, status="running")], T0)
    assert step.status == "done"


def test_intents_of_a_server_go_in_order_and_drain_enable_at_once():
    s = snap(
        [server(1), server(2)],
        [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "b", "loaded")],
        [],
    )
    steps = plan_intents(
        s,
        [intent(1, "unload", 1), intent(2, "drain"), intent(3, "enable", server_id=2)],
        T0,
    )
    assert [(x.intent_id, x.status) for x in steps] == [
        (1, "pending"),
        (2, "pending"),
        (3, "done"),
    ]
    assert steps[1].reason == "waiting for the server's earlier intents"
    assert steps[2].enable is True


@pytest.mark.django_db
def test_a_load_intents_options_go_to_that_load_only():
    srv = factories.server("sim")
    d = factories.deployment(srv, "a", load_options={"num_ctx": 4096})
    worker = Worker.objects.create(host="h", pid=1)
    Intent.objects.create(
        server=srv, action="load", deployment=d, options={"num_ctx": 8192, "keep_alive": "5m"}
    )
    job = store.start_load(d.pk, (), worker.pk, "operator intent")
    assert job.target.options["num_ctx"] == 8192 and job.target.options["keep_alive"] == "5m"
    d.refresh_from_db()
    assert d.load_options["num_ctx"] == 4096  # its own, untouched
    assert d.load_overrides == {"num_ctx": 8192, "keep_alive": "5m"}
    # Sent while that load is in place: the server is asked with the same options.
    _, loaded, _ = _loaded({srv.pk: 0}, [row(d, "loaded")])
    assert loaded[d.pk].load_options["num_ctx"] == 8192
    # The intent ends; the next load (the policy's) has only the deployment's own.
    Intent.objects.update(status="done")
    store.evicted(d.pk)
    job = store.start_load(d.pk, (), worker.pk, "policy")
    assert job.target.options["num_ctx"] == 4096 and "keep_alive" not in job.target.options
    d.refresh_from_db()
    assert d.load_overrides == {}
    assert _loaded({srv.pk: 0}, [row(d, "loaded")])[1][d.pk].load_options["num_ctx"] == 4096


def row(d: Deployment, state: str) -> tuple:
    """A deployment as the dispatch's query reads it."""
    own = (d.model.load_options, d.load_options, d.load_overrides)
    names = (d.pk, d.model_id, d.server_id, d.server.name, d.server_model_id)
    return (*names, *map(json.dumps, own), state, 0, d.slots)


@pytest.mark.django_db
def test_each_step_is_stored_and_logged_with_what_who_and_where(caplog):
    caplog.set_level("INFO", logger="scheduler.intents")
    srv = factories.server("gpu-1")
    d = factories.deployment(srv, "qwen3-8b")
    load = ask_load(d, "user ops")
    write_step(Step(load.pk, "running", "load started, evicting a"))
    assert load.traces.last().reason == "load started, evicting a"
    drain = record(srv, "drain", "key ops-script")
    write_step(Step(drain.pk, "done", "drained", enable=False))
    assert [r.getMessage() for r in caplog.records] == [
        f"intent {load.pk}, load qwen3-8b on gpu-1 (asked by user ops): running,"
        " load started, evicting a",
        f"intent {drain.pk}, drain gpu-1 (asked by key ops-script): done, drained",
    ]

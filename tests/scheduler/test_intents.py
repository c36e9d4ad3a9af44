"""Operators' intents as the loop plans them: pure, on hand-built snapshots."""

from scheduler.decisions import StartLoad, Unload
from scheduler.intents import IntentView, plan_intents
from tests.scheduler.builders import T0, dep, server, snap


def intent(id, action, deployment_id=None, status="pending", server_id=1, reason="asked"):
    return IntentView(id, action, server_id, deployment_id, status, True, reason)


def test_a_load_evicts_an_idle_model_as_the_policy_would():
    s = snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [])
    [step] = plan_intents(s, [intent(7, "load", 2)], T0)
    assert step.decision == StartLoad(2, (1,), "operator intent 7, evicting a")
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

"""The policy's invariants (scheduler/README.md) on hand-built snapshots; no database, no sleeps."""

from scheduler.decisions import Dispatch, Expire, Fail, MarkReady, Requeue, Route, StartLoad
from scheduler.policy import plan

from .builders import BACKGROUND, INTERACTIVE, at, dep, of, req, server, snap


def test_no_head_of_line_blocking_while_loading():
    """A load under way on s1 must not delay a request whose model is loaded on s2.
    Breaks if dispatch waited for loads or routing serialized on one queue."""
    a_waiting = req("a", state="needs_loading", deployment_id=1, age_s=5)
    b = req("b", age_s=1)
    decisions = plan(
        snap(
            [server(1), server(2)],
            [dep(1, 1, "a", "loading"), dep(2, 2, "b", "loaded")],
            [a_waiting, b],
        ),
        at(0),
    )
    assert Route(b.id, 2, True, "model loaded there (s2)") in decisions
    assert Dispatch(b.id, 2) in decisions


def test_one_load_at_a_time_per_server():
    """A second model for a server that is loading waits; breaks if loads overlap."""
    decisions = plan(
        snap([server(1, llm=2)], [dep(1, 1, "a", "loading"), dep(2, 1, "b")], [req("b")]),
        at(0),
    )
    assert of(decisions, StartLoad) == []


def test_loads_on_different_servers_run_in_parallel():
    """Two models, two idle servers: both loads start in the same pass."""
    decisions = plan(
        snap([server(1), server(2)], [dep(1, 1, "a"), dep(2, 2, "b")], [req("a"), req("b")]),
        at(0),
    )
    assert sorted(d.deployment_id for d in of(decisions, StartLoad)) == [1, 2]


def test_never_evicts_model_serving_a_request():
    """A busy model is never unloaded; the load waits. Breaks if eviction ignored in_flight."""
    decisions = plan(
        snap(
            [server(1, slots=2)],
            [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 1, "b")],
            [req("b")],
        ),
        at(0),
    )
    assert of(decisions, StartLoad) == []
    assert of(decisions, Fail) == []


def test_one_load_serves_all_waiters():
    """Three requests for one unloaded model start one load and all join it."""
    requests = [req("a", age_s=3), req("a", age_s=2), req("a", age_s=1)]
    decisions = plan(snap([server(1)], [dep(1, 1, "a")], requests), at(0))
    assert len(of(decisions, StartLoad)) == 1
    assert [r.ready for r in of(decisions, Route)] == [False, False, False]


def test_joins_a_load_already_under_way():
    """A new request for a model that is loading joins that load (no second StartLoad)."""
    r = req("a")
    decisions = plan(
        snap([server(1), server(2)], [dep(1, 1, "a", "loading"), dep(2, 2, "a")], [r]), at(0)
    )
    assert of(decisions, StartLoad) == []
    assert of(decisions, Route)[0].deployment_id == 1


def test_finished_load_makes_waiters_ready_and_dispatches():
    r = req("a", state="needs_loading", deployment_id=1)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [r]), at(0))
    assert decisions[:2] == [MarkReady(r.id, 1), Dispatch(r.id, 1)]


def test_interactive_dispatched_before_earlier_background():
    """One free slot: the interactive request goes first even though it arrived later."""
    bg = req("a", BACKGROUND, age_s=30, state="ready", deployment_id=1)
    ia = req("a", INTERACTIVE, age_s=1, state="ready", deployment_id=1)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [bg, ia]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(ia.id, 1)]


def test_fifo_within_a_class():
    first = req("a", age_s=10, state="ready", deployment_id=1)
    second = req("a", age_s=5, state="ready", deployment_id=1)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [second, first]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(first.id, 1)]


def test_evicts_least_valuable_idle_model_when_full():
    """Capacity 1: loading b evicts idle a."""
    decisions = plan(
        snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [req("b")]), at(0)
    )
    assert of(decisions, StartLoad)[0].evict == (1,)


def test_expires_requests_waiting_past_their_limit():
    r = req("a", age_s=200, expires_at=at(-1))
    decisions = plan(snap([server(1)], [dep(1, 1, "a")], [r]), at(0))
    assert of(decisions, Expire)[0].request_id == r.id
    assert of(decisions, StartLoad) == []


def test_unknown_deployment_fails_clearly():
    r = req("ghost")
    decisions = plan(snap([server(1)], [], [r]), at(0))
    assert of(decisions, Fail)[0].code == "model_not_deployed"


def test_ready_request_goes_back_to_routing_when_model_unloaded():
    r = req("a", state="ready", deployment_id=1)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "unloaded")], [r]), at(0))
    assert of(decisions, Requeue)[0].request_id == r.id


def test_same_snapshot_same_decisions():
    """Deterministic: the policy reads no clock and no randomness."""
    s = snap(
        [server(1), server(2)],
        [dep(1, 1, "a"), dep(2, 2, "a", "loaded")],
        [req("a", age_s=i) for i in range(5)],
    )
    assert plan(s, at(0)) == plan(s, at(0))

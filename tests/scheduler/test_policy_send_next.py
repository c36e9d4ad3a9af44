"""`SendNext`: what a pass would send to a busy server's slots as they free, planned before
they free (pure snapshots, no database)."""

from datetime import timedelta

from scheduler.decisions import Dispatch, SendNext
from scheduler.policy import plan

from .builders import BACKGROUND, INTERACTIVE, at, dep, of, req, server, snap


def next_sends(decisions) -> list[tuple[int, object, int]]:
    return [(n.server_id, n.request_id, n.deployment_id) for n in of(decisions, SendNext)]


def test_the_best_ready_request_is_next_for_a_busy_slot():
    """One slot busy, a flood of background work and an interactive request: the
    interactive one is next, whatever arrived before it. Breaks if the next send ignored
    rank, or were planned beside a dispatch."""
    flood = [req("a", BACKGROUND, age_s=60 - i, state="ready", deployment_id=1) for i in range(5)]
    ia = req("a", INTERACTIVE, age_s=1, state="ready", deployment_id=1)
    s = snap([server(1)], [dep(1, 1, "a", "loaded", in_flight=1)], [*flood, ia])

    decisions = plan(s, at(0))

    assert of(decisions, Dispatch) == []
    assert next_sends(decisions) == [(1, ia.id, 1)]
    [planned] = of(decisions, SendNext)
    assert (planned.expires_at, planned.effective_priority) == (ia.expires_at, INTERACTIVE)


def test_one_next_send_per_slot_best_first():
    queue = [req("a", age_s=30 - i, state="ready", deployment_id=1) for i in range(4)]
    s = snap([server(1, slots=3)], [dep(1, 1, "a", "loaded", in_flight=3)], queue)

    assert next_sends(plan(s, at(0))) == [(1, r.id, 1) for r in queue[:3]]


def test_what_fits_now_is_dispatched_and_the_rest_is_next():
    queue = [req("a", age_s=30 - i, state="ready", deployment_id=1) for i in range(4)]
    s = snap([server(1, slots=2)], [dep(1, 1, "a", "loaded", in_flight=1)], queue)

    decisions = plan(s, at(0))

    assert of(decisions, Dispatch) == [Dispatch(queue[0].id, 1)]
    assert next_sends(decisions) == [(1, queue[1].id, 1), (1, queue[2].id, 1)]


def test_a_server_with_a_free_slot_has_no_next_send():
    """Its free slot is the pass's to fill (here it waits for a retry's backoff)."""
    backing_off = req("a", state="ready", deployment_id=1, not_before=at(5))
    queued = req("a", age_s=1, state="ready", deployment_id=1)
    s = snap([server(1, slots=2)], [dep(1, 1, "a", "loaded")], [backing_off, queued])

    decisions = plan(s, at(0))

    assert of(decisions, Dispatch) == [Dispatch(queued.id, 1)]
    assert next_sends(decisions) == []


def test_no_next_send_while_a_request_waits_to_be_placed_on_that_server():
    """B outranks A's queue but cannot evict A while A serves: once A's slot frees, the
    pass must see A idle and load B. Breaks if the freed slot went straight to A's queue,
    keeping A busy for ever (B starved)."""
    queued = req("a", age_s=5, state="ready", deployment_id=1)
    b = req("b", INTERACTIVE)
    deployments = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 1, "b")]

    decisions = plan(snap([server(1)], deployments, [queued, b]), at(0))

    assert next_sends(decisions) == []


def test_a_queue_drains_onto_another_busy_server_holding_its_model():
    """Both servers full; s1's queue is next on either slot that frees first (free_slot_for
    sends it to any server with its model loaded)."""
    queued = req("a", age_s=5, state="ready", deployment_id=1)
    deployments = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "a", "loaded", in_flight=1)]

    decisions = plan(snap([server(1), server(2)], deployments, [queued]), at(0))

    assert next_sends(decisions) == [(1, queued.id, 1), (2, queued.id, 2)]


def test_no_next_send_to_an_unusable_server_or_a_request_still_backing_off():
    backing_off = req("a", state="ready", deployment_id=1, not_before=at(5))
    s = snap([server(1)], [dep(1, 1, "a", "loaded", in_flight=1)], [backing_off])
    assert next_sends(plan(s, at(0))) == []

    queued = req("a", state="ready", deployment_id=1)
    cooling = server(1, health="cooldown", cooldown_until=at(0) + timedelta(minutes=1))
    s = snap([cooling], [dep(1, 1, "a", "loaded", in_flight=1)], [queued])
    assert next_sends(plan(s, at(0))) == []


def test_a_model_being_unloaded_gets_no_next_send():
    """A loaded deployment is the only target: one whose model is on its way out (or not in
    yet) is not sent to."""
    queued = req("a", state="ready", deployment_id=1)
    loading = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 1, "b", "loading")]
    waiting_b = req("b", state="needs_loading", deployment_id=2)
    s = snap([server(1, slots=1, llm=2)], loading, [queued, waiting_b])
    assert next_sends(plan(s, at(0))) == [(1, queued.id, 1)]

    unloading = [dep(1, 1, "a", "unloading", in_flight=1)]
    assert next_sends(plan(snap([server(1)], unloading, [queued]), at(0))) == []

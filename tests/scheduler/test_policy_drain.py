"""Draining a busy model for a better class's load (scheduler/README.md, "Draining"): a
model that still runs requests cannot be evicted, so a load that may evict it once idle
stops it taking more work of a worse class; it runs dry, then goes.

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from scheduler.decisions import Dispatch, SendNext, SendOnArrival
from scheduler.policy import plan, plan_explained

from .builders import BACKGROUND, INTERACTIVE, NORMAL, at, dep, loads, of, req, server, snap


def test_a_busy_model_takes_no_more_worse_work_while_a_better_class_waits_to_load():
    """One GPU box, one LLM room: `big` serves a background batch that keeps coming, one
    request running, one slot free; a person asks for `small`. The free slot is not given
    to the next background request: `big` runs dry, then `small` loads. Breaks if the
    interactive request waited for the whole batch, however long it went on."""
    big = dep(1, 1, "big", "loaded", in_flight=1)
    person = req("small", INTERACTIVE, age_s=5)
    batch = [req("big", BACKGROUND, age_s=3 - i, state="ready", deployment_id=1) for i in range(3)]
    s = snap([server(1, slots=2)], [big, dep(2, 1, "small")], [person, *batch])

    decided = plan_explained(s, at(0))

    assert of(decided.decisions, Dispatch) == []
    assert of(decided.decisions, SendNext) == [] and of(decided.decisions, SendOnArrival) == []
    assert decided.reasons[person.id].text == (
        "no load of small can start now: s1 first finishes the 1 running on big"
    )
    assert decided.reasons[batch[0].id].text == (
        "held: big on s1 takes no more until it gives way to a better class's load"
    )

    idle = dep(1, 1, "big", "loaded")  # its last request ended
    assert loads(
        plan(snap([server(1, slots=2)], [idle, dep(2, 1, "small")], [person, *batch]), at(1))
    ) == [(2, (1,))]


def test_work_of_the_same_class_is_not_held_by_a_drain():
    """A normal request waiting for a load does not hold back normal work: within a class
    the line is first come, first served, and collation decides the switch. Breaks if a
    drain held requests of the waiting request's own class."""
    big = dep(1, 1, "big", "loaded", in_flight=1)
    waiting = req("small", NORMAL, age_s=5)
    queued = req("big", NORMAL, age_s=3, state="ready", deployment_id=1)
    decisions = plan(
        snap([server(1, slots=2)], [big, dep(2, 1, "small")], [waiting, queued]), at(0)
    )
    assert of(decisions, Dispatch) == [Dispatch(queued.id, 1)]


def test_no_drain_against_requests_that_waited_for_the_load():
    """`big` finished loading for its batch a moment ago: no wasted load keeps it, busy or
    idle, until that batch is served, so the batch is sent; nothing is drained for the
    interactive request, which could not evict it anyway. Breaks if a drain let a better
    class throw away a load before it served the requests that waited for it."""
    big = dep(1, 1, "big", "loaded", in_flight=1, loaded_at=at(-2))
    person = req("small", INTERACTIVE, age_s=1)
    batch = [req("big", BACKGROUND, age_s=30 - i, state="ready", deployment_id=1) for i in range(3)]
    decided = plan_explained(
        snap([server(1, slots=2)], [big, dep(2, 1, "small")], [person, *batch]), at(0)
    )
    assert of(decided.decisions, Dispatch) == [Dispatch(batch[0].id, 1)]
    assert decided.reasons[person.id].text == (
        "held: big on s1 first serves the 3 requests that waited for its load"
    )


def test_a_load_that_has_served_is_drained_for_a_person_behind_a_whole_batch():
    """A background batch of 150 waited for `big`'s load (a cheap 0.2 s one), and it has
    served their first: the load was not wasted, so the rest of the batch is weighed
    (collation) and a person's request for `small` drains it. Before, no wasted load held
    it until all 150 were served: against a real router, an interactive request waited
    75 s behind a batch of 300, and another expired."""
    big = dep(
        1, 1, "big", "loaded", in_flight=1, loaded_at=at(-2), last_used_at=at(-1), avg_load_s=0.2
    )
    person = req("small", INTERACTIVE, age_s=1)
    batch = [req("big", BACKGROUND, age_s=30, state="ready", deployment_id=1) for _ in range(150)]
    s = snap([server(1, slots=2)], [big, dep(2, 1, "small", avg_load_s=0.2)], [person, *batch])

    decided = plan_explained(s, at(0))

    assert of(decided.decisions, Dispatch) == []
    assert decided.reasons[person.id].text == (
        "no load of small can start now: s1 first finishes the 1 running on big"
    )
    # Not yet used since its load: the batch that waited for it is served first.
    fresh = dep(1, 1, "big", "loaded", in_flight=1, loaded_at=at(-2), avg_load_s=0.2)
    s = snap([server(1, slots=2)], [fresh, dep(2, 1, "small", avg_load_s=0.2)], [person, *batch])
    sent = of(plan(s, at(0)), Dispatch)
    assert len(sent) == 1 and sent[0].request_id in {r.id for r in batch}


def test_one_server_is_drained_the_one_that_runs_dry_soonest():
    """Two one-room servers, each busy with a background batch of its own model; a person
    waits for `small`, which either could load. Only the server with fewer requests running
    is drained: one load is needed, and the other server keeps serving its batch. Breaks if
    every server that could make room left a slot idle for one request."""
    servers = [server(1, slots=3), server(2, slots=3)]
    a = dep(1, 1, "a", "loaded", in_flight=2)
    b = dep(2, 2, "b", "loaded", in_flight=1)
    person = req("small", INTERACTIVE, age_s=5)
    for_a = req("a", BACKGROUND, age_s=3, state="ready", deployment_id=1)
    for_b = req("b", BACKGROUND, age_s=3, state="ready", deployment_id=2)
    deployments = [a, b, dep(3, 1, "small"), dep(4, 2, "small")]

    decisions = plan(snap(servers, deployments, [person, for_a, for_b]), at(0))

    assert of(decisions, Dispatch) == [Dispatch(for_a.id, 1)]

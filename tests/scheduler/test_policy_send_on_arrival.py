"""`SendOnArrival`: with no request left waiting, where the next request for each loaded
model goes, planned before it arrives (pure snapshots, no database)."""

from dataclasses import replace

from scheduler.decisions import Dispatch, Route, SendOnArrival
from scheduler.policy import plan

from .builders import at, dep, of, req, server, snap


def arrivals(decisions) -> list[tuple[str, int, int, int]]:
    return [(a.model, a.deployment_id, a.server_id, a.room) for a in of(decisions, SendOnArrival)]


def test_a_loaded_model_with_a_free_slot_takes_the_next_arrival():
    """Breaks if a model not loaded, or loaded on a full server, were planned for."""
    s = snap(
        [server(1, slots=2, llm=2), server(2)],
        [
            dep(1, 1, "a", "loaded", in_flight=1),
            dep(2, 1, "b", "unloaded"),
            dep(3, 2, "c", "loaded", in_flight=1),
        ],
        [],
    )

    assert arrivals(plan(s, at(0))) == [("a", 1, 1, 1)]


def test_the_plan_is_what_a_pass_would_do_for_the_arrival():
    """The next arrival goes where a pass that saw it would route and send it: the least
    busy server with its model loaded."""
    s = snap(
        [server(1, slots=2), server(2, slots=2)],
        [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "a", "loaded")],
        [],
    )
    [planned] = of(plan(s, at(0)), SendOnArrival)

    arrived = req("a")
    decisions = plan(replace(s, requests=(arrived,)), at(0))

    assert of(decisions, Route)[0].deployment_id == planned.deployment_id == 2
    assert of(decisions, Dispatch) == [Dispatch(arrived.id, 2)]
    assert planned.room == 2


def test_requests_the_pass_sends_take_their_slots_from_the_room():
    queue = [req("a", age_s=10 - i, state="ready", deployment_id=1) for i in range(2)]
    s = snap([server(1, slots=3)], [dep(1, 1, "a", "loaded")], queue)

    decisions = plan(s, at(0))

    assert len(of(decisions, Dispatch)) == 2
    assert arrivals(decisions) == [("a", 1, 1, 1)]


def test_no_arrival_is_planned_for_a_server_a_waiting_request_could_use():
    """A request still waiting for a model the server holds (for its retry's backoff, for a
    load there that evicts) may be what its free slot or its room is for: the next pass
    decides, seeing both. Breaks if the plan ignored them."""
    warm = dep(1, 1, "a", "loaded", last_interactive_at=at(-10))  # not evicted for b yet
    for waiting in (
        req("a", state="ready", deployment_id=1, not_before=at(5)),
        req("b", state="pending"),
    ):
        s = snap([server(1, slots=2)], [warm, dep(2, 1, "b")], [waiting])
        assert arrivals(plan(s, at(0))) == []


def test_a_load_elsewhere_does_not_hold_up_arrivals_for_a_loaded_model():
    """Requests wait for a long load on s1; a model loaded on s2 still takes its next
    arrival at once (no head-of-line blocking, without a pass)."""
    s = snap(
        [server(1), server(2)],
        [dep(1, 1, "big", "loading"), dep(2, 2, "small", "loaded")],
        [req("big", state="needs_loading", deployment_id=1)],
    )

    assert arrivals(plan(s, at(0))) == [("small", 2, 2, 1)]


def test_a_model_more_requests_may_wait_for_than_the_snapshot_holds_keeps_its_server():
    """A snapshot of a deep line holds its heads: the pass may send every request it saw
    for a model while more wait unseen, so that model's server takes no arrival. A model
    whose requests it holds all (here b, none waiting) still does."""
    seen = req("a", state="ready", deployment_id=1)
    servers = [server(1, slots=2), server(2)]
    s = snap(servers, [dep(1, 1, "a", "loaded"), dep(2, 2, "b", "loaded")], [seen])

    decisions = plan(replace(s, unseen=frozenset({"a"})), at(0))

    assert of(decisions, Dispatch) == [Dispatch(seen.id, 1)]
    assert arrivals(decisions) == [("b", 2, 2, 1)]
    # Had the snapshot held all of a's, a's second slot would take a's next arrival: the
    # request the pass sent there claims nothing once sent.
    assert arrivals(plan(s, at(0))) == [("a", 1, 1, 1), ("b", 2, 2, 1)]
    assert arrivals(plan(replace(s, unseen=frozenset({"b"})), at(0))) == [("a", 1, 1, 1)]


def test_servers_out_of_service_and_models_going_away_take_no_arrival():
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "b", "loaded"), dep(3, 3, "c", "loaded")]
    servers = [
        server(1, enabled=False),
        server(2, health="cooldown", cooldown_until=at(60)),
        server(3),
    ]
    idle = replace(deployments[2], idle_ttl_s=60.0, last_used_at=at(-120))
    decisions = plan(snap(servers, [*deployments[:2], idle], []), at(0))

    assert arrivals(decisions) == []  # c is unloaded by this very pass: idle past its TTL

"""A load nobody waits for gives way (scheduler/README.md, "A load nobody waits for gives
way"), on hand-built snapshots: a load whose requests have all gone is stopped (`StopLoad`)
when another request needs its server's one load channel, on servers that can stop one.

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from scheduler.decisions import Dispatch, StopLoad
from scheduler.policy import plan, plan_explained

from .builders import (
    at,
    dep,
    loads,
    of,
    req,
    routed,
    server,
    snap,
)


def test_stop_load_an_orphaned_load_gives_way_to_a_request_that_needs_the_channel():
    """a's load lost every request it was started for; b needs s1's one load channel. a's
    load is stopped (once, however many wait for the channel), b waits for that stop, and
    b's load starts once a is unloaded. Breaks if b waited for a load nobody wants to end."""
    b, c = req("b", age_s=2), req("c", age_s=1)
    s1 = server(1, llm=1, stops_loads=True)
    deployments = [dep(1, 1, "a", "loading"), dep(2, 1, "b"), dep(3, 1, "c")]
    explained = plan_explained(snap([s1], deployments, [b, c]), at(0))
    assert of(explained.decisions, StopLoad) == [StopLoad(1, "gives way to a load of b")]
    assert loads(explained.decisions) == [] and routed(explained.decisions) == {}
    reason = explained.reasons[b.id]
    assert reason.text == "waiting for the stop of a's load on s1 (nobody waits for it)"
    assert explained.reasons[c.id].text == (
        "no load of c can start now: another load is under way on s1"
    )

    stopped = [dep(1, 1, "a", "unloaded"), dep(2, 1, "b"), dep(3, 1, "c")]
    after = plan(snap([s1], stopped, [b, c]), at(1))
    assert loads(after) == [(2, ())] and routed(after) == {b.id: 2}
    assert of(after, StopLoad) == []


def test_stop_load_not_while_someone_waits_for_it():
    """A request still waits for a's load: it is never stopped, b waits its turn. Breaks if
    a load someone needs were thrown away for another."""
    waiter = req("a", age_s=5, state="needs_loading", deployment_id=1)
    s1 = server(1, stops_loads=True)
    deployments = [dep(1, 1, "a", "loading"), dep(2, 1, "b")]
    decisions = plan(snap([s1], deployments, [waiter, req("b")]), at(0))
    assert of(decisions, StopLoad) == [] and loads(decisions) == []


def test_stop_load_not_on_a_server_that_cannot_stop_a_load():
    """A server kind without `stops_loads` (LM Studio, Ollama, …) lets the load end. Breaks
    if the policy asked a server for a stop it cannot make."""
    deployments = [dep(1, 1, "a", "loading"), dep(2, 1, "b")]
    decisions = plan(snap([server(1)], deployments, [req("b")]), at(0))
    assert of(decisions, StopLoad) == []


def test_stop_load_not_when_nobody_needs_the_channel():
    """Nobody asks for s1's load channel (no request, or one served where its model is
    loaded): the load that nobody waits for is left to end. Breaks if loads were stopped
    for nothing (the lead's housekeeping rule decides about those)."""
    s1, s2 = server(1, stops_loads=True), server(2, stops_loads=True)
    deployments = [dep(1, 1, "a", "loading"), dep(2, 1, "b"), dep(3, 2, "b", "loaded")]
    assert of(plan(snap([s1, s2], deployments, []), at(0)), StopLoad) == []
    decisions = plan(snap([s1, s2], deployments, [req("b")]), at(0))
    assert of(decisions, StopLoad) == [] and len(of(decisions, Dispatch)) == 1


def test_stop_load_not_a_preload_nor_with_its_evictions_under_way():
    """A preload or an operator's load intent is a load the operator asked for, and a load
    whose victims still unload has a step left that a stop would cut in two: none is
    stopped. A restore (nobody asked for it) is."""
    s1 = server(1, llm=2, stops_loads=True)
    for cause in ("preload", "operator"):
        asked = [dep(1, 1, "a", "loading", load_cause=cause), dep(2, 1, "b")]
        assert of(plan(snap([s1], asked, [req("b")]), at(0)), StopLoad) == []
    restore = [dep(1, 1, "a", "loading", load_cause="restore"), dep(2, 1, "b")]
    assert of(plan(snap([s1], restore, [req("b")]), at(0)), StopLoad) != []
    evicting = [dep(1, 1, "a", "loading"), dep(2, 1, "b"), dep(3, 1, "c", "unloading")]
    assert of(plan(snap([s1], evicting, [req("b")]), at(0)), StopLoad) == []

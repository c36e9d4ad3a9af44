"""One or more tests per policy rule (scheduler/README.md), on hand-built snapshots.

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from dataclasses import replace

from scheduler.decisions import (
    Defer,
    Dispatch,
    Fail,
    Probe,
    Requeue,
    Route,
    StartLoad,
    Unload,
)
from scheduler.policy import effective_priority, plan

from .builders import BACKGROUND, HIGH, INTERACTIVE, NORMAL, at, dep, of, req, server, snap


def loads(decisions) -> list[tuple[int, tuple[int, ...]]]:
    return [(d.deployment_id, d.evict) for d in of(decisions, StartLoad)]


def routed(decisions) -> dict:
    return {d.request_id: d.deployment_id for d in of(decisions, Route)}


def defer(decisions) -> Defer | None:
    found = of(decisions, Defer)
    return found[0] if found else None


# -- classes, FIFO, aging ----------------------------------------------------------------


def test_classes_lower_wins():
    """Interactive 0, high 1, normal 2, background 3: dispatch order follows the class, not
    arrival. Breaks if the order of the classes were inverted or arrival came first."""
    requests = [
        req("a", p, age_s=10 - p, state="ready", deployment_id=1)
        for p in (BACKGROUND, NORMAL, HIGH, INTERACTIVE)
    ]
    decisions = plan(snap([server(1, slots=4)], [dep(1, 1, "a", "loaded")], requests), at(0))
    assert [d.request_id for d in of(decisions, Dispatch)] == [r.id for r in requests[::-1]]


def test_classes_fifo_within_a_class_across_routing():
    """Same class: the earlier request is routed and dispatched first, whatever the snapshot
    order. Breaks if routing or dispatch followed list order."""
    first, second = req("a", age_s=20), req("a", age_s=10)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [second, first]), at(0))
    assert [d.request_id for d in of(decisions, Route)] == [first.id, second.id]
    assert of(decisions, Dispatch) == [Dispatch(first.id, 1)]


def test_classes_waiting_request_never_interrupts_one_in_flight():
    """A background request is being served; an interactive one for another model waits.
    Breaks if the policy evicted a busy model or unloaded it for priority."""
    ia = req("b", INTERACTIVE)
    decisions = plan(
        snap([server(1)], [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 1, "b")], [ia]), at(0)
    )
    assert of(decisions, StartLoad) == [] and of(decisions, Unload) == []
    assert of(decisions, Fail) == []


def test_aging_moves_up_one_class_per_step():
    """Effective class = priority − waited // aging_step_s, and keeps falling below 0."""
    bg = req("a", BACKGROUND, age_s=0)
    assert [effective_priority(bg, at(s), 150) for s in (0, 149, 150, 300, 450, 600)] == [
        3,
        3,
        2,
        1,
        0,
        -1,
    ]
    assert effective_priority(bg, at(60), 30) == 1


def test_aging_background_served_under_steady_interactive_stream():
    """A background request ages to interactive after 3 steps (450 s by default) and is then
    older than every interactive request, so it takes the next slot: served within ~10
    minutes. Breaks if aging were missing or capped above interactive."""
    stream = [req("a", INTERACTIVE, age_s=s, state="ready", deployment_id=1) for s in (5, 60)]
    bg = req("a", BACKGROUND, age_s=451, state="ready", deployment_id=1)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [*stream, bg]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(bg.id, 1)]

    younger = req("a", BACKGROUND, age_s=449, state="ready", deployment_id=1)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [*stream, younger]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(stream[1].id, 1)]


def test_rescue_a_request_about_to_expire_goes_first():
    """An interactive request 20 s from its expiry (2 minutes) goes before a background
    request aged past interactive, which has most of its hour left; without the rescue it
    would wait behind every aged one and expire (the simulated flood's interactive requests
    did, queued on a loaded model). Among rescued requests, the earliest expiry goes first."""
    loaded = dep(1, 1, "a", "loaded")
    ia = req("a", INTERACTIVE, age_s=100, state="ready", deployment_id=1, expires_at=at(20))
    bg = req("a", BACKGROUND, age_s=600, state="ready", deployment_id=1)
    assert of(plan(snap([server(1)], [loaded], [ia, bg]), at(0)), Dispatch) == [Dispatch(ia.id, 1)]
    # 40 s from its expiry it waits its turn (rescue_s is 30 s).
    later = replace(ia, expires_at=at(40))
    assert of(plan(snap([server(1)], [loaded], [later, bg]), at(0)), Dispatch) == [
        Dispatch(bg.id, 1)
    ]
    dying = replace(bg, expires_at=at(10))
    assert of(plan(snap([server(1)], [loaded], [ia, dying]), at(0)), Dispatch) == [
        Dispatch(dying.id, 1)
    ]


def test_aging_step_is_a_knob():
    """With aging_step_s=10 a background request 30 s old already beats fresh interactive."""
    ia = req("a", INTERACTIVE, age_s=1, state="ready", deployment_id=1)
    bg = req("a", BACKGROUND, age_s=31, state="ready", deployment_id=1)
    s = snap([server(1)], [dep(1, 1, "a", "loaded")], [ia, bg], aging_step_s=10)
    assert of(plan(s, at(0)), Dispatch) == [Dispatch(bg.id, 1)]


# -- collation ---------------------------------------------------------------------------


def test_collation_serves_loaded_model_before_switching():
    """A B A B A on a one-model server with A loaded is served A A A B B: pass by pass, the
    A requests are routed to A and B's load waits until A's queue is empty. Breaks if B
    evicted A while A requests were waiting."""
    a1, b1, a2, b2, a3 = (req(m, age_s=50 - i) for i, m in enumerate("ABABA".lower()))
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b")]
    first = plan(snap([server(1)], deployments, [a1, b1, a2, b2, a3]), at(0))
    assert routed(first) == {a1.id: 1, a2.id: 1, a3.id: 1}
    assert of(first, StartLoad) == [] and of(first, Dispatch) == [Dispatch(a1.id, 1)]

    # a1 done, a2 in flight, a3 waiting: still no switch.
    serving = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 1, "b")]
    a3_ready = req("a", age_s=46, state="ready", deployment_id=1, id=a3.id)
    middle = plan(snap([server(1)], serving, [b1, b2, a3_ready]), at(0))
    assert of(middle, StartLoad) == [] and of(middle, Route) == []

    # A's queue is empty and A is idle: now B loads, once, for both B requests.
    last = plan(snap([server(1)], deployments, [b1, b2]), at(0))
    assert loads(last) == [(2, (1,))]
    assert routed(last) == {b1.id: 2, b2.id: 2}


def test_collation_sees_pending_requests_for_the_loaded_model():
    """B arrived before A2, both normal, A loaded and idle: A2 is routed to A and B waits.
    Breaks if B, routed first, evicted A and A2 then had to reload it (a ping-pong)."""
    b, a2 = req("b", age_s=20), req("a", age_s=10)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [b, a2]), at(0))
    assert of(decisions, StartLoad) == []
    assert of(decisions, Dispatch) == [Dispatch(a2.id, 1)]


def test_collation_yields_to_a_request_that_outranks_the_queue():
    """An interactive request outranks a queue of normal ones: the switch happens, and the
    evicted model's ready requests are not dispatched in the same pass: they go back to
    routing at once, told it was our own eviction (not "a is unloaded on its server", which
    reads as an unload behind our back)."""
    queued = req("a", NORMAL, age_s=5, state="ready", deployment_id=1)
    ia = req("b", INTERACTIVE)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b")]
    decisions = plan(snap([server(1)], deployments, [queued, ia]), at(0))
    assert loads(decisions) == [(2, (1,))]
    assert of(decisions, Dispatch) == []
    assert of(decisions, Requeue) == [Requeue(queued.id, "evicted from s1 for b (interactive)")]


def test_no_wasted_load_a_finished_load_serves_its_batch_first():
    """A finished loading 5 s ago for two normal requests that waited for it. An interactive
    request for B aged a step (weight 16) would outweigh their cheap reload (16 · 20 s of
    drain > 4 · 23 s), but may not throw the load away before it served them: it waits.
    Breaks if a better class could evict a load before it served its batch (the simulated
    day's waiters then waited for a second load)."""
    a = dep(1, 1, "a", "loaded", loaded_at=at(-5), avg_load_s=3.0)
    batch = [req("a", NORMAL, age_s=70 - i, state="ready", deployment_id=1) for i in range(2)]
    ia = req("b", INTERACTIVE, age_s=160)
    decisions = plan(snap([server(1, slots=1)], [a, dep(2, 1, "b")], [*batch, ia]), at(0))
    assert of(decisions, StartLoad) == []
    assert of(decisions, Dispatch) == [Dispatch(batch[0].id, 1)]


def test_no_wasted_load_ends_once_the_batch_is_served():
    """Only requests that arrived after the load finished wait for A: priced collation
    decides, and an interactive request outweighs one normal waiter's reload."""
    a = dep(1, 1, "a", "loaded", loaded_at=at(-60), avg_load_s=10.0)
    late = req("a", NORMAL, age_s=5, state="ready", deployment_id=1)
    ia = req("b", INTERACTIVE)
    decisions = plan(snap([server(1)], [a, dep(2, 1, "b")], [late, ia]), at(0))
    assert loads(decisions) == [(2, (1,))]


def test_outranking_weighs_the_victims_reload_against_what_it_saves():
    """Five background requests queue for A (a 90 s reload); a fresh interactive request for
    B saves 8 · 50 s of drain but costs them 5 · (10 + 10 + 90) s: it waits. With A a 10 s
    reload (5 · 30 = 150 < 400) it evicts. Breaks if a better class always won."""
    for load_s, expected in ((90.0, []), (10.0, [(2, (1,))])):
        a = dep(1, 1, "a", "loaded", avg_load_s=load_s)
        queue = [req("a", BACKGROUND, age_s=5, state="ready", deployment_id=1) for _ in range(5)]
        ia = req("b", INTERACTIVE)
        decisions = plan(snap([server(1)], [a, dep(2, 1, "b")], [*queue, ia]), at(0))
        assert loads(decisions) == expected


def test_collation_is_bounded_by_aging():
    """A normal B request that has waited two aging steps (now interactive, weight 8) wins
    over a fresh normal queue for A (weight 2): 8 · 10 s of drain > 2 · (10 + 10 + 10) s.
    One step (weight 4) is not yet worth A's reload. Breaks if collation could hold B back
    for ever, or let B evict as soon as it merely outranked the queue."""
    queued = req("a", NORMAL, age_s=5, state="ready", deployment_id=1)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b")]
    one_step = req("b", NORMAL, age_s=151)
    assert loads(plan(snap([server(1)], deployments, [queued, one_step]), at(0))) == []
    two_steps = req("b", NORMAL, age_s=301)
    assert loads(plan(snap([server(1)], deployments, [queued, two_steps]), at(0))) == [(2, (1,))]


def test_collation_is_bounded_for_interactive_too():
    """Interactive cannot move up a class, but it keeps aging below 0: after one step it
    outranks a fresh interactive queue, and after two its weight (32) outweighs the queue's
    reload (8 · 30 s). Breaks if aging were floored at interactive."""
    queued = req("a", INTERACTIVE, age_s=5, state="ready", deployment_id=1)
    old_b = req("b", INTERACTIVE, age_s=301)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b")]
    assert loads(plan(snap([server(1)], deployments, [queued, old_b]), at(0))) == [(2, (1,))]


# -- minimum residency -------------------------------------------------------------------


def residency_case(priority: int, loaded_s_ago: float, **config):
    a = dep(1, 1, "a", "loaded", loaded_at=at(-loaded_s_ago), last_used_at=at(-1), last_priority=2)
    return plan(snap([server(1)], [a, dep(2, 1, "b")], [req("b", priority)], **config), at(0))


def test_min_residency_keeps_a_just_loaded_model():
    """Loaded 10 s ago for normal work: a normal request for B waits until 30 s, with a Defer
    at that moment. Breaks if models could be swapped out right after loading."""
    decisions = residency_case(NORMAL, 10)
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(20)


def test_min_residency_ends():
    assert loads(residency_case(NORMAL, 31)) == [(2, (1,))]


def test_min_residency_yields_to_a_request_that_outranks_its_users():
    """An interactive request outranks the normal work A was loaded for: no wait."""
    assert loads(residency_case(INTERACTIVE, 10)) == [(2, (1,))]


def test_min_residency_is_a_knob():
    assert loads(residency_case(NORMAL, 10, min_residency_s=5)) == [(2, (1,))]


def test_min_residency_bounds_interactive_ping_pong():
    """Two interactive users alternate between A and B on a one-model server. B was just
    loaded for one of them; the other's request for A waits out B's residency instead of
    swapping back at once. Breaks if every interactive request could swap the model."""
    b = dep(2, 1, "b", "loaded", loaded_at=at(-5), last_used_at=at(-1), last_priority=0)
    decisions = plan(snap([server(1)], [dep(1, 1, "a"), b], [req("a", INTERACTIVE)]), at(0))
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(25)


# -- affinity guards ---------------------------------------------------------------------


def warm_a(**fields):
    return dep(1, 1, "a", "loaded", last_interactive_at=at(-60), **fields)


def test_warm_window_keeps_interactive_model_from_normal_work():
    """A served an interactive request 60 s ago: a normal request (weight 2) is held until
    it has paid what the switch is expected to cost interactive work, A's reload (10 s)
    times the interactive weight (8): 40 s, with a Defer then; never past the window's end
    (60 s from now)."""
    decisions = plan(snap([server(1)], [warm_a(), dep(2, 1, "b")], [req("b", NORMAL)]), at(0))
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(40)
    slow = warm_a(avg_load_s=90.0)
    decisions = plan(snap([server(1)], [slow, dep(2, 1, "b")], [req("b", NORMAL)]), at(0))
    assert defer(decisions).until == at(60)
    paid = plan(snap([server(1)], [warm_a(), dep(2, 1, "b")], [req("b", NORMAL, age_s=40)]), at(0))
    assert loads(paid) == [(2, (1,))]


def test_warm_window_lets_high_and_interactive_through():
    for priority in (HIGH, INTERACTIVE):
        decisions = plan(snap([server(1)], [warm_a(), dep(2, 1, "b")], [req("b", priority)]), at(0))
        assert loads(decisions) == [(2, (1,))]


def test_warm_window_ends():
    s = snap([server(1)], [warm_a(), dep(2, 1, "b")], [req("b", NORMAL)])
    assert loads(plan(s, at(61))) == [(2, (1,))]


def test_warm_window_sends_request_to_another_server():
    """Held back on s1 (where the warm model is the cheapest victim), the request loads on s2
    instead, with no Defer for the guard. Breaks if guards only ever made requests wait.
    """
    s1_victim = warm_a(last_used_at=at(-60))
    s2_victim = dep(3, 2, "c", "loaded", last_used_at=at(-30), avg_load_s=60.0)
    deployments = [s1_victim, dep(2, 1, "b"), s2_victim, dep(4, 2, "b")]
    r = req("b", NORMAL)
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert loads(decisions) == [(4, (3,))]
    assert defer(decisions) is None or "warm" not in defer(decisions).reason


def test_activity_window_holds_background_switches():
    """Interactive work ran on s1 four minutes ago (on model C): a background request
    (weight 1) is held until it has paid half the interactive weight times A's reload
    (4 · 10 s), never past the window's end; a normal one is not held."""
    c = dep(3, 1, "c", "unloaded", last_interactive_at=at(-240))
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b"), c]
    decisions = plan(snap([server(1)], deployments, [req("b", BACKGROUND)]), at(0))
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(40)
    normal = plan(snap([server(1)], deployments, [req("b", NORMAL)]), at(0))
    assert loads(normal) == [(2, (1,))]


def test_activity_window_does_not_stop_loads_into_free_room():
    """The guard is about switches (evictions): loading into free room goes ahead."""
    c = dep(3, 1, "c", "unloaded", last_interactive_at=at(-240))
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b"), c]
    decisions = plan(snap([server(1, llm=2)], deployments, [req("b", BACKGROUND)]), at(0))
    assert loads(decisions) == [(2, ())]


def test_activity_window_is_lifted_by_aging_after_one_step():
    """Documented: a background request that has waited one aging step (150 s) counts as
    normal and is no longer held by the activity window (only by the warm window)."""
    c = dep(3, 1, "c", "unloaded", last_interactive_at=at(-240))
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b"), c]
    decisions = plan(snap([server(1)], deployments, [req("b", BACKGROUND, age_s=150)]), at(0))
    assert loads(decisions) == [(2, (1,))]


# -- switch batching ---------------------------------------------------------------------


def two_homes_for_b() -> list:
    """b can load on s1 or s2, each holding an idle model used a minute ago."""
    return [
        dep(1, 1, "a", "loaded", last_used_at=at(-60)),
        dep(2, 1, "b"),
        dep(3, 2, "c", "loaded", last_used_at=at(-60)),
        dep(4, 2, "b"),
    ]


def busy_homes_for_b() -> list:
    """As `two_homes_for_b`, each server's one slot busy with another model (x, y)."""
    return [
        *two_homes_for_b(),
        dep(5, 1, "x", "loaded", in_flight=1),
        dep(6, 2, "y", "loaded", in_flight=1),
    ]


def test_switch_batching_holds_while_the_batch_has_paid_less_than_a_load():
    """A fresh request would have to evict on either server, and neither has a free slot:
    the switch is held until the waiting batch has paid one load of b in its own weight
    (10 s), so the requests arriving meanwhile share one switch and a server may free up.
    Breaks if every request switched a model on arrival (the simulation's thrash)."""
    for priority in (NORMAL, BACKGROUND):
        r = req("b", priority, age_s=4)
        homes = [server(1, llm=2), server(2, llm=2)]
        decisions = plan(snap(homes, busy_homes_for_b(), [r]), at(0))
        assert of(decisions, StartLoad) == []
        assert defer(decisions).until == at(6)
    two = [req("b", NORMAL, age_s=2), req("b", NORMAL, age_s=4)]  # paid 12 of 20, at 4/s
    decisions = plan(snap([server(1, llm=2), server(2, llm=2)], busy_homes_for_b(), two), at(0))
    assert defer(decisions).until == at(2)


def test_switch_batching_ends_once_paid():
    r = req("b", NORMAL, age_s=10)
    decisions = plan(snap([server(1, llm=2), server(2, llm=2)], busy_homes_for_b(), [r]), at(0))
    assert len(loads(decisions)) == 1


def test_switch_batching_never_holds_with_a_free_slot():
    """No protected work expected and the server has a free slot: nothing is gained by
    holding. Breaks if a fresh request waited with both servers idle (the demo's 2 min)."""
    r = req("b", BACKGROUND)
    decisions = plan(snap([server(1), server(2)], two_homes_for_b(), [r]), at(0))
    assert len(loads(decisions)) == 1


def test_switch_batching_not_for_high_or_interactive():
    for priority in (HIGH, INTERACTIVE):
        s = snap([server(1), server(2)], two_homes_for_b(), [req("b", priority)])
        assert len(loads(plan(s, at(0)))) == 1


def test_switch_batching_not_with_a_single_home():
    """With one server that can hold the model there is nothing to wait for: a user of one
    machine switching models at the default (normal) class is not held."""
    s = snap([server(1)], two_homes_for_b()[:2], [req("b", NORMAL)])
    assert loads(plan(s, at(0))) == [(2, (1,))]


def test_switch_batching_does_not_hold_loads_into_free_room():
    deployments = [*two_homes_for_b(), dep(5, 3, "b")]
    s = snap([server(1), server(2), server(3)], deployments, [req("b", BACKGROUND)])
    assert loads(plan(s, at(0))) == [(5, ())]


# -- routing order -----------------------------------------------------------------------


def test_routing_loaded_with_free_slot_first():
    """s1 has the model but is busy; s2 has it and is free: s2."""
    r = req("a")
    deployments = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "a", "loaded")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 2)]


def test_routing_loaded_before_loading():
    """Busy with a short queue beats a load under way elsewhere."""
    r = req("a")
    deployments = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "a", "loading")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert of(decisions, Route) == [Route(r.id, 1, True, "model loaded there (s1)")]


def test_routing_new_load_prefers_free_room():
    """s1 would have to evict, s2 has room: s2, even though s1 sorts first."""
    deployments = [dep(1, 1, "x", "loaded"), dep(2, 1, "a"), dep(3, 2, "a")]
    decisions = plan(snap([server(1), server(2)], deployments, [req("a")]), at(0))
    assert loads(decisions) == [(3, ())]


def test_routing_new_load_prefers_cheapest_eviction():
    """Both must evict; s2's victim is cheaper to bring back (short load, long idle)."""
    deployments = [
        dep(1, 1, "x", "loaded", avg_load_s=90.0, last_used_at=at(-60)),
        dep(2, 1, "a"),
        dep(3, 2, "y", "loaded", avg_load_s=5.0, last_used_at=at(-600)),
        dep(4, 2, "a"),
    ]
    decisions = plan(snap([server(1), server(2)], deployments, [req("a", HIGH)]), at(0))
    assert loads(decisions) == [(4, (3,))]


def test_routing_new_load_prefers_fewest_evictions():
    """s1 must evict two cheap models, s2 one dearer one: s2. Every eviction is a likely
    reload; breaks if the summed keep value alone chose (seen in the simulation: a 32B model
    pushing two interactive models off a server, which then pushed a third one elsewhere)."""
    cheap = {"avg_load_s": 5.0, "last_used_at": at(-300), "size_mb": 12_000}
    deployments = [
        dep(1, 1, "x", "loaded", **cheap),
        dep(2, 1, "y", "loaded", **cheap),
        dep(3, 1, "a", size_mb=20_000),
        dep(4, 2, "z", "loaded", avg_load_s=60.0, last_used_at=at(-300), size_mb=20_000),
        dep(5, 2, "a", size_mb=20_000),
    ]
    servers = [server(1, llm=2, memory_mb=24_000), server(2, llm=2, memory_mb=24_000)]
    decisions = plan(snap(servers, deployments, [req("a", HIGH)]), at(0))
    assert loads(decisions) == [(5, (4,))]


def test_routing_new_load_prefers_fewest_waiting():
    """Both have room; s1 already has requests waiting on it: s2."""
    busy = [dep(1, 1, "x", "loaded", in_flight=1), dep(2, 1, "a")]
    waiting = req("x", state="ready", deployment_id=1)
    deployments = [*busy, dep(3, 2, "a")]
    s = snap([server(1, llm=2), server(2)], deployments, [waiting, req("a")])
    assert loads(plan(s, at(0))) == [(3, ())]


def test_routing_new_load_prefers_the_tightest_fit():
    """Room on both: a small model goes where it leaves the least memory spare, keeping the
    big server's room for the big models only it can hold. Breaks if small models spread
    onto the big server first and were evicted again (seen in the simulation)."""
    servers = [server(1, llm=2, memory_mb=48_000), server(2, llm=2, memory_mb=16_000)]
    deployments = [dep(1, 1, "small", size_mb=800), dep(2, 2, "small", size_mb=800)]
    assert loads(plan(snap(servers, deployments, [req("small")]), at(0))) == [(2, ())]


# -- capacity and eviction in the policy -------------------------------------------------


def test_capacity_model_larger_than_budget_fails_at_once():
    r = req("huge")
    decisions = plan(
        snap([server(1, memory_mb=8000)], [dep(1, 1, "huge", size_mb=9000)], [r]), at(0)
    )
    [fail] = of(decisions, Fail)
    assert fail.code == "model_too_large" and "9000 MB" in fail.message


def test_capacity_all_room_pinned_fails_clearly():
    """Every slot for the type is pinned: requests needing a load fail at once."""
    deployments = [dep(1, 1, "a", "loaded", pinned=True), dep(2, 1, "b")]
    [fail] = of(plan(snap([server(1)], deployments, [req("b")]), at(0)), Fail)
    assert "pinned" in fail.message


def test_capacity_pinned_on_one_server_routes_to_another():
    deployments = [dep(1, 1, "a", "loaded", pinned=True), dep(2, 1, "b"), dep(3, 2, "b")]
    decisions = plan(snap([server(1), server(2)], deployments, [req("b")]), at(0))
    assert loads(decisions) == [(3, ())] and of(decisions, Fail) == []


def test_capacity_loads_serialized_per_server_while_unloading():
    """An unload under way counts as a load in progress: the next load waits for it."""
    deployments = [dep(1, 1, "a", "unloading"), dep(2, 1, "b")]
    assert of(plan(snap([server(1, llm=2)], deployments, [req("b")]), at(0)), StartLoad) == []


def test_idle_ttl_unloads_an_idle_model():
    d = dep(1, 1, "a", "loaded", idle_ttl_s=60, last_used_at=at(-61))
    assert of(plan(snap([server(1)], [d], []), at(0)), Unload)[0].deployment_id == 1


def test_idle_ttl_defers_until_it_runs_out():
    d = dep(1, 1, "a", "loaded", idle_ttl_s=60, last_used_at=at(-20))
    decisions = plan(snap([server(1)], [d], []), at(0))
    assert of(decisions, Unload) == [] and defer(decisions).until == at(40)


def test_idle_ttl_spares_pinned_busy_and_wanted_models():
    """Pinned, in flight, or asked for by a pending request: not unloaded."""
    stale = {"idle_ttl_s": 60, "last_used_at": at(-600)}
    cases = [
        ([dep(1, 1, "a", "loaded", pinned=True, **stale)], []),
        ([dep(1, 1, "a", "loaded", in_flight=1, **stale)], []),
        ([dep(1, 1, "a", "loaded", **stale)], [req("a", not_before=at(30))]),
    ]
    for deployments, requests in cases:
        assert of(plan(snap([server(1)], deployments, requests), at(0)), Unload) == []


def test_preload_when_there_is_room_and_the_server_is_up():
    d = dep(1, 1, "a", preload=True)
    assert loads(plan(snap([server(1)], [d], []), at(0))) == [(1, ())]
    assert loads(plan(snap([server(1, health="unknown")], [d], []), at(0))) == []
    full = [dep(2, 1, "b", "loaded"), d]
    assert loads(plan(snap([server(1)], full, []), at(0))) == []


# -- failures ----------------------------------------------------------------------------


def test_failure_nuclear_retry_clears_the_server():
    """After a failed load (not "not found"), the retry evicts every idle model on the
    server, even ones it has room beside, but never pinned or busy ones."""
    deployments = [
        dep(1, 1, "x", "loaded"),
        dep(2, 1, "emb", "loaded", model_type="embedding"),
        dep(3, 1, "pin", "loaded", pinned=True),
        dep(4, 1, "busy", "loaded", in_flight=1),
        dep(5, 1, "a", load_failures=1, last_error_code="load_failed", last_error="OOM"),
    ]
    decisions = plan(snap([server(1, slots=2, llm=5)], deployments, [req("a")]), at(0))
    assert loads(decisions) == [(5, (1, 2))]


def test_failure_not_found_fails_waiting_requests():
    """A permanent failure fails the requests that waited for the load, with its code."""
    r = req("a", state="needs_loading", deployment_id=1)
    d = dep(1, 1, "a", "failed", last_error_code="not_found", last_error="no such model")
    decisions = plan(snap([server(1)], [d], [r]), at(0))
    assert of(decisions, Requeue)[0].request_id == r.id
    assert of(decisions, Fail) == [Fail(r.id, "not_found", "no such model")]


def test_failure_spent_attempts_fail_new_requests_at_once():
    """A deployment left failed after its attempts fails new requests for it at once."""
    d = dep(1, 1, "a", "failed", last_error_code="load_failed", last_error="out of memory")
    [fail] = of(plan(snap([server(1)], [d], [req("a")]), at(0)), Fail)
    assert fail.code == "load_failed" and fail.message == "out of memory"


def test_failure_fails_every_waiting_request_for_the_model_alike():
    """A deep line for a model no server can ever load: each request gets its Fail, with
    the same code. Breaks if the pass stopped failing them after the first (it asks the
    deployments once per model, not once per request)."""
    d = dep(1, 1, "a", "failed", last_error_code="load_failed", last_error="out of memory")
    requests = [req("a", age_s=30 - i) for i in range(3)]
    fails = of(plan(snap([server(1)], [d], [*requests, req("b")]), at(0)), Fail)
    by_request = {f.request_id: (f.code, f.message) for f in fails}
    assert [by_request.get(r.id) for r in requests] == [("load_failed", "out of memory")] * 3


def test_failure_requests_held_back_alike_wait_for_the_earliest_moment():
    """Several requests for a model whose load backs off: none loads or fails, and the
    loop is woken when the backoff ends; a request for another model still loads."""
    d = dep(1, 1, "a", load_failures=1, last_error_code="load_failed", last_error="boom")
    d = replace(d, next_load_at=at(7))
    requests = [req("a", age_s=30 - i) for i in range(3)]
    other = req("b", age_s=1)
    decisions = plan(snap([server(1), server(2)], [d, dep(2, 2, "b")], [*requests, other]), at(0))
    assert loads(decisions) == [(2, ())] and routed(decisions) == {other.id: 2}
    assert of(decisions, Fail) == [] and defer(decisions).until == at(7)


def test_failure_on_one_server_goes_to_another():
    d1 = dep(1, 1, "a", "failed", last_error_code="not_found", last_error="missing")
    decisions = plan(snap([server(1), server(2)], [d1, dep(2, 2, "a")], [req("a")]), at(0))
    assert loads(decisions) == [(2, ())] and of(decisions, Fail) == []


def test_failure_backoff_is_respected_with_a_defer():
    """next_load_at in the future: no load, and the loop is woken exactly then."""
    r = req("a", state="needs_loading", deployment_id=1)
    d = dep(1, 1, "a", load_failures=1, last_error_code="load_failed", last_error="boom")
    d = replace(d, next_load_at=at(7))
    decisions = plan(snap([server(1)], [d], [r]), at(0))
    assert of(decisions, Requeue)[0].request_id == r.id
    assert of(decisions, StartLoad) == [] and of(decisions, Fail) == []
    assert defer(decisions).until == at(7)


def cooling(id: int, until: float):
    return server(id, health="cooldown", cooldown_until=at(until))


def test_failure_cooldown_server_is_skipped():
    """s1 has the model loaded but is cooling down: load it on s2 instead."""
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "a")]
    decisions = plan(snap([cooling(1, 30), server(2)], deployments, [req("a")]), at(0))
    assert loads(decisions) == [(2, ())]


def test_failure_cooldown_requests_wait_and_probe_when_it_ends():
    """Only s1 has the model: the request waits (not failed, within its no-server grace),
    the loop wakes when the cooldown ends, and then a Probe is emitted."""
    ready = req("a", state="ready", deployment_id=1)
    s = snap([cooling(1, 30)], [dep(1, 1, "a", "loaded")], [ready, req("a")], no_server_grace_s=60)
    decisions = plan(s, at(0))
    assert of(decisions, Requeue)[0].request_id == ready.id
    assert of(decisions, Route) == [] and of(decisions, Fail) == []
    assert defer(decisions).until == at(30)
    assert of(plan(s, at(30)), Probe) == [Probe(1)]


# -- fail fast when nothing can serve ------------------------------------------------------


def nowhere() -> tuple[list, list]:
    """`a` on s1 (down) and s2 (disabled), `b` on s3 (up)."""
    servers = [server(1, health="down"), server(2, enabled=False), server(3)]
    return servers, [dep(1, 1, "a"), dep(2, 2, "a"), dep(3, 3, "b")]


def test_no_server_waits_its_grace_then_fails_naming_the_servers():
    """Every server of `a` is down or disabled: the request waits 15 s (a Defer then), then
    fails with no_server_available and why each server cannot serve. Breaks if it waited
    silently to its class maximum (two minutes to an hour), as before."""
    servers, deployments = nowhere()
    fresh = req("a", INTERACTIVE, age_s=5)
    decisions = plan(snap(servers, deployments, [fresh]), at(0))
    assert of(decisions, Fail) == [] and defer(decisions).until == at(10)
    late = plan(snap(servers, deployments, [req("a", INTERACTIVE, age_s=15, id=fresh.id)]), at(0))
    assert of(late, Fail) == [
        Fail(fresh.id, "no_server_available", "no server can serve a: s1 is down; s2 is disabled")
    ]


def test_no_server_grace_is_a_knob_and_a_job_may_ask_for_longer():
    servers, deployments = nowhere()
    old = req("a", age_s=20)
    assert of(plan(snap(servers, deployments, [old], no_server_grace_s=30), at(0)), Fail) == []
    patient = req("a", age_s=600, no_server_grace_s=3600)
    decisions = plan(snap(servers, deployments, [patient]), at(0))
    assert of(decisions, Fail) == [] and defer(decisions).until == at(3000)


def test_no_server_counts_from_when_the_server_went_away():
    """A request that waited 10 minutes behind a queue before its only server went down 5 s
    ago gets the whole grace from then."""
    down = server(1, health="down", unavailable_since=at(-5))
    decisions = plan(snap([down], [dep(1, 1, "a")], [req("a", BACKGROUND, age_s=600)]), at(0))
    assert of(decisions, Fail) == [] and defer(decisions).until == at(10)


def test_no_server_a_server_that_comes_back_serves_as_before():
    servers, deployments = nowhere()
    waiting = req("a", age_s=10)
    back = [replace(servers[0], health="up"), *servers[1:]]
    decisions = plan(snap(back, deployments, [waiting]), at(0))
    assert of(decisions, Fail) == [] and loads(decisions) == [(1, ())]


def test_no_server_counts_a_failed_deployment_beside_a_down_server():
    failed = dep(1, 1, "a", "failed", last_error="out of memory")
    servers = [server(1), server(2, health="down")]
    r = req("a", age_s=16)
    decisions = plan(snap(servers, [failed, dep(2, 2, "a")], [r]), at(0))
    assert of(decisions, Fail) == [
        Fail(
            r.id,
            "no_server_available",
            "no server can serve a: a failed to load on s1: out of memory; s2 is down",
        )
    ]


# -- known weaknesses, fixed -------------------------------------------------------------


def long_queue(queued: int):
    busy = dep(1, 1, "a", "loaded", in_flight=1)
    waiting = [req("a", age_s=10 + i, state="ready", deployment_id=1) for i in range(queued)]
    return [busy, dep(2, 2, "a")], waiting


def test_parallel_load_beside_a_long_queue():
    """s1 (1 slot) is busy with two more requests queued for A; s2 has a deployment of A and
    free room. A new request starts a load there instead of queueing third."""
    deployments, waiting = long_queue(2)
    r = req("a")
    decisions = plan(snap([server(1), server(2)], deployments, [*waiting, r]), at(0))
    assert loads(decisions) == [(2, ())]
    assert of(decisions, Route) == [Route(r.id, 2, False, "load started (s2)")]


def test_parallel_load_not_for_a_short_queue():
    """One request queued: the new one queues on s1 (a load costs more than a short wait)."""
    deployments, waiting = long_queue(1)
    r = req("a")
    decisions = plan(snap([server(1), server(2)], deployments, [*waiting, r]), at(0))
    assert of(decisions, StartLoad) == [] and routed(decisions) == {r.id: 1}


def test_parallel_load_evicts_only_what_the_queue_is_worth():
    """s2 would have to evict x, last used by normal work (its reload, 10 s, at weight 2,
    costs 20). Three normal requests queued drain in 15 s on two slots, saving 2 · 3 · 5/2 =
    15: no parallel load. Ten drain in 50 s, saving 2 · 10 · 40/2 = 400: x goes."""
    x = dep(3, 2, "x", "loaded", last_priority=NORMAL)
    deployments, waiting = long_queue(3)
    s = snap([server(1), server(2)], [*deployments, x], [*waiting, req("a")])
    assert of(plan(s, at(0)), StartLoad) == []
    deployments, waiting = long_queue(10)
    s = snap([server(1), server(2)], [*deployments, x], [*waiting, req("a")])
    assert loads(plan(s, at(0))) == [(2, (3,))]


def test_parallel_load_beside_a_long_load_queue():
    """A batch for A waits on its load on s1 (one slot): once it is done, one request runs
    and the rest queue. With two already queued behind the slot, the next request starts a
    second load on s2, where there is room, instead of joining (the simulated day's flood
    of 200 background requests waited for one server's load before the second began)."""
    loading = dep(1, 1, "a", "loading")
    batch = [req("a", age_s=5, state="needs_loading", deployment_id=1) for _ in range(3)]
    r, servers, deployments = req("a"), [server(1), server(2)], [loading, dep(2, 2, "a")]
    decisions = plan(snap(servers, deployments, [*batch, r]), at(0))
    assert loads(decisions) == [(2, ())] and routed(decisions) == {r.id: 2}
    # Two waiting (one runs at once, one queues): the new request joins the load.
    decisions = plan(snap(servers, deployments, [*batch[1:], r]), at(0))
    assert of(decisions, StartLoad) == [] and routed(decisions) == {r.id: 1}


def test_parallel_load_queue_is_a_knob():
    deployments, waiting = long_queue(1)
    s = snap([server(1), server(2)], deployments, [*waiting, req("a")], parallel_load_queue=1)
    assert loads(plan(s, at(0))) == [(2, ())]


def test_queue_drains_onto_another_server_with_the_model():
    """A request queued on busy s1 is dispatched on s2 once s2 has A loaded and a free slot.
    Breaks if ready requests were tied to the server they were first routed to."""
    queued = req("a", state="ready", deployment_id=1)
    deployments = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "a", "loaded")]
    decisions = plan(snap([server(1), server(2)], deployments, [queued]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(queued.id, 2)]


def test_retry_backoff_of_a_request_is_respected():
    """A ready request with not_before in the future is not dispatched; Defer at not_before."""
    r = req("a", state="ready", deployment_id=1, not_before=at(3))
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [r]), at(0))
    assert of(decisions, Dispatch) == [] and defer(decisions).until == at(3)
    assert of(plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [r]), at(3)), Dispatch)


def test_with_every_slot_taken_a_retry_waits_for_a_freed_slot_not_its_time():
    """Nothing can be sent while every slot is taken: the pass stops looking (a freed slot
    wakes the loop), and plans no wake-up for a retry's time."""
    busy = dep(1, 1, "a", "loaded", in_flight=1)
    r = req("a", state="ready", deployment_id=1, not_before=at(3), expires_at=at(600))
    decisions = plan(snap([server(1)], [busy], [r]), at(0))
    assert of(decisions, Dispatch) == [] and defer(decisions).until != at(3)


def test_defer_is_the_earliest_wake():
    """One Defer, for the earliest of several known moments (expiry, TTL, backoff)."""
    r = req("a", expires_at=at(100))
    d = dep(1, 1, "a", "loaded", idle_ttl_s=60, last_used_at=at(-10))
    other = dep(2, 1, "b", next_load_at=at(5), load_failures=1, last_error_code="connection")
    decisions = plan(snap([server(1, llm=2)], [d, other], [r, req("b")]), at(0))
    assert len(of(decisions, Defer)) == 1 and defer(decisions).until == at(5)

"""One or more tests per policy rule (scheduler/README.md), on hand-built snapshots: what
holds a switch back (collation, a load about to be too late, minimum residency, the
affinity guards, switch batching). The order of the line: test_policy_order.py; routing
and room: test_policy_routing.py; failures: test_policy_failures.py.

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from scheduler.decisions import (
    Dispatch,
    Requeue,
    Route,
    StartLoad,
)
from scheduler.policy import plan
from scheduler.snapshot import DeploymentView

from .builders import (
    BACKGROUND,
    HIGH,
    INTERACTIVE,
    NORMAL,
    at,
    defer,
    dep,
    loads,
    of,
    req,
    routed,
    server,
    snap,
)

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
    assert of(decisions, Requeue) == [Requeue(queued.id, "evicted from s1 for b (interactive)", 1)]


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


# -- a request about to expire -------------------------------------------------------------


def urgent_case(age_s: float, a_load_s: float = 10.0, queued: int = 1):
    """An interactive request for B (a 10 s load, two minutes to live) that has waited
    `age_s`; A, idle on the one-model server, has `queued` interactive requests waiting for
    it (retries backing off, so the slot stays free)."""
    a = dep(1, 1, "a", "loaded", avg_load_s=a_load_s)
    queue = [
        req("a", INTERACTIVE, age_s=5, state="ready", deployment_id=1, not_before=at(30))
        for _ in range(queued)
    ]
    ia = req("b", INTERACTIVE, age_s=age_s, expires_at=at(120 - age_s))
    return plan(snap([server(1)], [a, dep(2, 1, "b")], [*queue, ia]), at(0))


def test_urgent_load_passes_collation_when_it_would_otherwise_expire():
    """Fresh, the request waits for A's queue of its own class (collation). 100 s into its
    120 s its load must start within 20 s (`urgent_load_s`) or it expires: it evicts A, whose
    one waiter pays 8 · 10 s for the reload against the 8 · 120 s it would lose. Breaks if
    holds made a request expire that a load started in time would serve (the simulated
    day's interactive request behind a queue stuck behind the aged 14:00 flood)."""
    assert loads(urgent_case(age_s=0)) == []
    assert loads(urgent_case(age_s=100)) == [(2, (1,))]


def test_urgent_load_only_while_it_can_still_serve_it():
    """115 s in, a 10 s load can no longer serve it before it expires: no eviction for it."""
    assert loads(urgent_case(age_s=115)) == []


def test_urgent_load_weighs_the_queue_it_evicts():
    """Two waiters for A, a 90 s reload: 16 · 90 s > 8 · 120 s, the urgent request waits."""
    assert loads(urgent_case(age_s=100, a_load_s=90.0, queued=2)) == []


def test_urgent_load_never_throws_away_a_finished_load():
    """A finished loading 5 s ago for the request waiting on it: even an urgent request
    waits for that one to be served (no wasted load comes first)."""
    a = dep(1, 1, "a", "loaded", loaded_at=at(-5), avg_load_s=3.0)
    waiter = req("a", INTERACTIVE, age_s=20, state="ready", deployment_id=1, not_before=at(30))
    ia = req("b", INTERACTIVE, age_s=100, expires_at=at(20))
    decisions = plan(snap([server(1)], [a, dep(2, 1, "b")], [waiter, ia]), at(0))
    assert loads(decisions) == []


# -- minimum residency -------------------------------------------------------------------


def residency_case(priority: int, loaded_s_ago: float, load_s: float = 60.0, **config):
    a = dep(
        1,
        1,
        "a",
        "loaded",
        loaded_at=at(-loaded_s_ago),
        last_used_at=at(-1),
        last_priority=2,
        avg_load_s=load_s,
    )
    return plan(snap([server(1)], [a, dep(2, 1, "b")], [req("b", priority)], **config), at(0))


def test_min_residency_keeps_a_just_loaded_model():
    """Loaded 10 s ago for normal work: a background request for B waits until 30 s, with a
    Defer at that moment. Breaks if models could be swapped out right after loading."""
    decisions = residency_case(BACKGROUND, 10)
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(20)


def test_min_residency_ends():
    assert loads(residency_case(BACKGROUND, 31)) == [(2, (1,))]


def test_min_residency_yields_to_a_request_that_outranks_its_users():
    """An interactive request outranks the normal work A was loaded for: no wait."""
    assert loads(residency_case(INTERACTIVE, 10)) == [(2, (1,))]


def test_min_residency_is_a_knob():
    assert loads(residency_case(BACKGROUND, 10, min_residency_s=5)) == [(2, (1,))]


def test_min_residency_is_no_longer_than_a_reload():
    """A that loads in 2 s was loaded 5 s ago: a normal request for B is not held for the
    rest of the 30 s (its wait would cost more than A's next user could lose); one that
    loads in 8 s keeps A until 8 s after its load. Breaks if a model that loads in a blink
    held an idle server for 30 s, as `tiny` on a real llama-server router did."""
    assert loads(residency_case(BACKGROUND, 5, load_s=2.0)) == [(2, (1,))]
    decisions = residency_case(BACKGROUND, 5, load_s=8.0)
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(3)


def test_min_residency_holds_no_request_of_its_users_class():
    """Two interactive users alternate between A and B on a one-model server. B was just
    loaded for one of them, whose request has ended: the other's request for A, which
    waits now, swaps at once rather than wait for a next request for B that may never come
    (issue 34: no hold while the server has a free slot and no protected work is expected).
    Requests of the same class that do wait for B keep it (collation). Breaks if residency
    held a waiting request for a hypothetical one of its own class: on the simulated day,
    seed 2, interactive p95 36.8 s against 30.9 s."""
    b = dep(
        2, 1, "b", "loaded", loaded_at=at(-5), last_used_at=at(-1), last_priority=0, avg_load_s=40
    )
    decisions = plan(snap([server(1)], [dep(1, 1, "a"), b], [req("a", INTERACTIVE)]), at(0))
    assert loads(decisions) == [(1, (2,))]
    waiter = req("b", INTERACTIVE, age_s=1, state="ready", deployment_id=2)
    line = [req("a", INTERACTIVE, age_s=2), waiter]
    decisions = plan(snap([server(1)], [dep(1, 1, "a"), b], line), at(0))
    assert of(decisions, StartLoad) == []


# -- affinity guards ---------------------------------------------------------------------


def warm_a(**fields):
    return dep(1, 1, "a", "loaded", last_interactive_at=at(-10), **fields)


def busy_room() -> DeploymentView:
    """s1's other room, taken by a model at work: B goes in A's, and A can come back beside
    B (into C's room once C is idle), so a switch costs A's users its reload alone."""
    return dep(9, 1, "c", "loaded", in_flight=1)


def test_warm_window_keeps_interactive_model_from_normal_work():
    """A served an interactive request 10 s ago: a normal request (weight 2) is held until
    it has paid what the switch is expected to cost interactive work, A's reload (10 s)
    times the interactive weight (8): 40 s, with a Defer then; never past the normal warm
    window's end (60 s after that use, 50 s from now)."""
    two_rooms = [server(1, llm=2)]
    line = [req("b", NORMAL)]
    decisions = plan(snap(two_rooms, [warm_a(), dep(2, 1, "b"), busy_room()], line), at(0))
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(40)
    slow = warm_a(avg_load_s=90.0)
    decisions = plan(snap(two_rooms, [slow, dep(2, 1, "b"), busy_room()], line), at(0))
    assert defer(decisions).until == at(50)


def test_warm_window_on_one_room_prices_the_run_the_victim_waits_behind():
    """On a server that holds one model (a router's `--models-max 1`), interactive work that
    comes back for A waits for what B runs then as well as A's reload: a background request
    that runs 20 s (B's measured run time) beside a model that reloads in 0.2 s is held
    until it has paid (0.2 + 20) · 8, up to the warm window's end (120 s after that use);
    where A can come back beside B, the 0.2 s reload alone is priced: 1.6 s.
    Breaks if chat on a one-model server waited behind background runs the moment it
    paused (the reload alone priced the hold at under a second)."""
    quick_a = warm_a(avg_load_s=0.2)
    b = dep(2, 1, "b", avg_inference_s=20.0)
    held = plan(snap([server(1)], [quick_a, b], [req("b", BACKGROUND)]), at(0))
    assert of(held, StartLoad) == []
    assert defer(held).until == at(110)  # (0.2 + 20) · 8 = 161.6 s of price: the window's end
    pair = [req("b", BACKGROUND, age_s=60) for _ in range(2)]  # paid 120 of 161.6
    assert defer(plan(snap([server(1)], [quick_a, b], pair), at(0))).until == at(20.8)
    two_rooms = [server(1, llm=2)]
    beside = plan(snap(two_rooms, [quick_a, b, busy_room()], [req("b", BACKGROUND)]), at(0))
    assert defer(beside).until == at(1.6)  # 0.2 · 8
    one_model = [server(1, llm=2, max_models=1)]
    held = plan(snap(one_model, [quick_a, b], [req("b", BACKGROUND)]), at(0))
    assert of(held, StartLoad) == []


def test_warm_window_is_shorter_for_normal_switches():
    """A served an interactive request 90 s ago: past the normal warm window (60 s), inside
    the background one (120 s). A normal request switches at once; a background one is held
    until the window's end (its 80 s of price at weight 1 would last longer). Breaks if
    normal requests, whose own wait is already a load's time, were held as long as
    background ones (the simulated days' normal p95 went past self-swapping servers')."""
    a = dep(1, 1, "a", "loaded", last_interactive_at=at(-90))
    normal = plan(snap([server(1)], [a, dep(2, 1, "b")], [req("b", NORMAL)]), at(0))
    assert loads(normal) == [(2, (1,))]
    background = plan(snap([server(1)], [a, dep(2, 1, "b")], [req("b", BACKGROUND)]), at(0))
    assert of(background, StartLoad) == [] and defer(background).until == at(30)
    longer = snap([server(1)], [a, dep(2, 1, "b")], [req("b", NORMAL)], normal_warm_window_s=120)
    assert of(plan(longer, at(0)), StartLoad) == []
    two_rooms = [server(1, llm=2)]
    line = [req("b", NORMAL, age_s=40)]
    paid = plan(snap(two_rooms, [warm_a(), dep(2, 1, "b"), busy_room()], line), at(0))
    assert loads(paid) == [(2, (1,))]


def test_warm_window_does_not_hold_a_long_background_batch():
    """Three background requests for B are held for the interactive work that used A 10 s
    ago. Four, more than the server's slot and a parallel-load queue (1 + 2), switch at
    once: they fill the server and queue behind it whatever the hold, and holding only
    delays them. Breaks if a flood waited out the window (the simulated 14:00 job held its
    first load 35 s, and its p95 passed the self-swapping servers')."""
    three = [req("b", BACKGROUND) for _ in range(3)]
    held = plan(snap([server(1)], [warm_a(), dep(2, 1, "b")], three), at(0))
    assert of(held, StartLoad) == []
    four = [*three, req("b", BACKGROUND)]
    assert loads(plan(snap([server(1)], [warm_a(), dep(2, 1, "b")], four), at(0))) == [(2, (1,))]


def test_warm_window_lets_high_and_interactive_through():
    for priority in (HIGH, INTERACTIVE):
        decisions = plan(snap([server(1)], [warm_a(), dep(2, 1, "b")], [req("b", priority)]), at(0))
        assert loads(decisions) == [(2, (1,))]


def test_warm_window_ends():
    s = snap([server(1)], [warm_a(), dep(2, 1, "b")], [req("b", NORMAL)])
    assert loads(plan(s, at(51))) == [(2, (1,))]


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
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 1, "b"), c, busy_room()]
    decisions = plan(snap([server(1, llm=2)], deployments, [req("b", BACKGROUND)]), at(0))
    assert of(decisions, StartLoad) == []
    assert defer(decisions).until == at(40)
    normal = plan(snap([server(1, llm=2)], deployments, [req("b", NORMAL)]), at(0))
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
    """Not with a free slot, nor with every slot busy: an interactive or high request that
    must switch a model does so at once, not after waiting a load's time for others to
    share it (the simulated day's interactive requests on the full servers of the 14:00
    flood waited up to 21 s more for gemma3-12b's 21 s load). Breaks if batching held
    them."""
    for priority in (HIGH, INTERACTIVE):
        s = snap([server(1), server(2)], two_homes_for_b(), [req("b", priority)])
        assert len(loads(plan(s, at(0)))) == 1
        homes = [server(1, llm=2), server(2, llm=2)]
        s = snap(homes, busy_homes_for_b(), [req("b", priority, age_s=4)])
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

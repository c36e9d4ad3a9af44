"""One or more tests per policy rule (scheduler/README.md), on hand-built snapshots: where a
request goes and the room it needs (failures and failing fast: test_policy_failures.py; the
line: test_policy_order.py; what holds a switch: test_policy_holds.py).

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from dataclasses import replace

import pytest

from scheduler.decisions import (
    Defer,
    Dispatch,
    Fail,
    Requeue,
    Route,
    StartLoad,
    Unload,
)
from scheduler.policy import plan

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


def test_idle_ttl_unloads_an_idle_model_if_its_server_runs_nothing_on_it():
    """Only if unused: a server may run requests on it that Switchyard did not send."""
    d = dep(1, 1, "a", "loaded", idle_ttl_s=60, last_used_at=at(-61))
    assert of(plan(snap([server(1)], [d], []), at(0)), Unload) == [
        Unload(1, "idle for 60 s", if_unused=True)
    ]


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


def test_parallel_load_prices_the_queue_at_its_measured_run_time():
    """The same three normal requests queued for A, whose requests are measured to run
    40 s: they drain in 60 s on two slots, saving 2 · 3 · (60 − 10)/2 = 150 > 20: x goes.
    Breaks if the drain were priced at the default 10 s a request whatever the model (the
    simulated flood's 20 s requests started their second server's load 17 s later)."""
    x = dep(3, 2, "x", "loaded", last_priority=NORMAL)
    deployments, waiting = long_queue(3)
    deployments[0] = replace(deployments[0], avg_inference_s=40.0)
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


def behind_a_long_line(ahead: int):
    """s1 (one slot, two LLMs) runs a request of B and holds A; `ahead` background requests
    for B wait there, aged 160 s: one class up already, and within one more step they rank
    before a fresh high request (created earlier, same class). s2 holds A too, unloaded."""
    deployments = [
        dep(1, 1, "a", "loaded"),
        dep(2, 1, "b", "loaded", in_flight=1),
        dep(3, 2, "a"),
    ]
    waiting = [
        req("b", BACKGROUND, age_s=160 + i, state="ready", deployment_id=2) for i in range(ahead)
    ]
    return [server(1, llm=2), server(2, llm=2)], deployments, waiting


def test_long_line_loads_the_model_where_it_is_sent_soon():
    """A high request for A, loaded on s1, would wait there behind three aging background
    requests (one slot): it loads A on s2, where nothing waits, instead. Breaks if a request
    joined any server that has its model loaded, whatever waits there first (the simulated
    day's high `qwen3-0.6b` request waited 281 s behind the aged 14:00 flood, a 3 s load
    away from an idle server)."""
    servers, deployments, waiting = behind_a_long_line(3)
    r = req("a", HIGH)
    decisions = plan(snap(servers, deployments, [*waiting, r]), at(0))
    assert loads(decisions) == [(3, ())] and routed(decisions) == {r.id: 3}
    # Two ahead (the slot's next and one more): a load costs more than that short wait.
    servers, deployments, waiting = behind_a_long_line(2)
    decisions = plan(snap(servers, deployments, [*waiting, r]), at(0))
    assert of(decisions, StartLoad) == [] and routed(decisions) == {r.id: 1}


def test_long_line_evicts_only_what_the_wait_is_worth():
    """s2 must evict x to load A (one LLM). Behind three requests (30 s at 10 s each on one
    slot), the high request saves 4 · (30 − 10) = 80: x, last used by normal work (15 s
    reload at weight 2, 30), goes; x last used by interactive work (15 s at weight 8, 120)
    stays, and the request queues on s1."""
    servers, deployments, waiting = behind_a_long_line(3)
    servers[1] = server(2, llm=1)
    r = req("a", HIGH)
    x = dep(4, 2, "x", "loaded", last_priority=NORMAL, avg_load_s=15.0)
    decisions = plan(snap(servers, [*deployments, x], [*waiting, r]), at(0))
    assert loads(decisions) == [(3, (4,))] and routed(decisions) == {r.id: 3}
    x = replace(x, last_priority=INTERACTIVE)
    decisions = plan(snap(servers, [*deployments, x], [*waiting, r]), at(0))
    assert of(decisions, StartLoad) == [] and routed(decisions) == {r.id: 1}


def test_long_line_queues_when_no_server_sends_it_sooner():
    """s2 has room for A but a line of its own (its slot busy, three aging requests for C
    ready there): a load there is a load and then that line, so the high request queues for
    A on s1 as before. Breaks if a request behind a long line took the free-room load meant
    for a long queue of its own model."""
    servers, deployments, waiting = behind_a_long_line(3)
    busy_c = dep(4, 2, "c", "loaded", in_flight=1)
    on_s2 = [req("c", BACKGROUND, age_s=160 + i, state="ready", deployment_id=4) for i in range(3)]
    r = req("a", HIGH)
    decisions = plan(snap(servers, [*deployments, busy_c], [*waiting, *on_s2, r]), at(0))
    assert of(decisions, StartLoad) == [] and routed(decisions) == {r.id: 1}


def test_routing_new_load_prefers_where_it_is_sent_soon():
    """A is loaded nowhere. s1 has free room for it, but its one slot is busy and three
    aging requests wait for it; s2 must evict an idle x, and nothing waits there. The load
    goes to s2: free room behind a long line is a load and then that line (the simulated
    day's high `qwen3-0.6b` request loaded in 3 s beside the 14:00 flood, then waited 159 s
    for a slot)."""
    servers, deployments, waiting = behind_a_long_line(3)
    deployments = [deployments[1], dep(5, 1, "a"), dep(3, 2, "a")]
    servers[1] = server(2, llm=1)
    x = dep(4, 2, "x", "loaded", last_priority=BACKGROUND)
    r = req("a", HIGH)
    decisions = plan(snap(servers, [*deployments, x], [*waiting, r]), at(0))
    assert loads(decisions) == [(3, (4,))] and routed(decisions) == {r.id: 3}


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


# -- deleted deployments and models ------------------------------------------------------


@pytest.mark.parametrize("state", ["needs_loading", "ready"])
def test_a_request_whose_deployment_was_deleted_is_routed_again(state):
    """Deleting a deployment (the admin, `apply_config --prune`) clears the link of what was
    routed to it: such a request goes back and is routed to another server with its model
    (it crashed the pass when ready, and waited to expiry when its load was due)."""
    r = req("a", state=state, deployment_id=None)
    decisions = plan(snap([server(2)], [dep(2, 2, "a", "loaded")], [r]), at(0))
    assert of(decisions, Requeue) == [Requeue(r.id, "its deployment was removed", None)]
    assert [(d.request_id, d.deployment_id, d.ready) for d in of(decisions, Route)] == [
        (r.id, 2, True)
    ]


def test_a_request_whose_model_was_deleted_fails_naming_why():
    """A deleted model's requests keep their row but lose the name the pass reads: they fail
    with model_not_found and say so (not "no server has a deployment of ")."""
    r = req("", state="ready", deployment_id=None)
    decisions = plan(snap([server(1)], [dep(1, 1, "a", "loaded")], [r]), at(0))
    assert of(decisions, Fail) == [
        Fail(r.id, "model_not_found", "its model was deleted while it waited")
    ]

"""One or more tests per policy rule (scheduler/README.md), on hand-built snapshots: failed
loads, retries, cooldowns, and failing fast when no server can serve a model (where a request
goes: test_policy_routing.py).

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from dataclasses import replace

from scheduler.decisions import (
    Fail,
    Probe,
    Requeue,
    Route,
    StartLoad,
)
from scheduler.policy import plan

from .builders import (
    BACKGROUND,
    INTERACTIVE,
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

# What a request failed for a deployment that failed for good is told, after the error.
FOR_GOOD = " (not tried there again until an operator resets it)"

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
    assert of(decisions, Fail) == [
        Fail(r.id, "not_found", f"a failed to load on s1: no such model{FOR_GOOD}")
    ]


def test_failure_spent_attempts_fail_new_requests_at_once():
    """A deployment left failed after its attempts fails new requests for it at once."""
    d = dep(1, 1, "a", "failed", last_error_code="load_failed", last_error="out of memory")
    [fail] = of(plan(snap([server(1)], [d], [req("a")]), at(0)), Fail)
    assert (
        fail.code == "load_failed"
        and fail.message == f"a failed to load on s1: out of memory{FOR_GOOD}"
    )


def test_failure_fails_every_waiting_request_for_the_model_alike():
    """A deep line for a model no server can ever load: each request gets its Fail, with
    the same code. Breaks if the pass stopped failing them after the first (it asks the
    deployments once per model, not once per request)."""
    d = dep(1, 1, "a", "failed", last_error_code="load_failed", last_error="out of memory")
    requests = [req("a", age_s=30 - i) for i in range(3)]
    fails = of(plan(snap([server(1)], [d], [*requests, req("b")]), at(0)), Fail)
    by_request = {f.request_id: (f.code, f.message) for f in fails}
    failed = ("load_failed", f"a failed to load on s1: out of memory{FOR_GOOD}")
    assert [by_request.get(r.id) for r in requests] == [failed] * 3


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
            f"no server can serve a: a failed to load on s1: out of memory{FOR_GOOD}; s2 is down",
        )
    ]

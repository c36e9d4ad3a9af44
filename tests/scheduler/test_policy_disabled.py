"""A deployment an operator disabled (pure policy): nothing is routed, sent or loaded there;
requests routed there go back to be placed elsewhere; loaded, it leaves its server once its
requests there finish, pinned or not; with no other home, its requests wait and say why,
then fail fast as for a server that is down. Nothing preloads or restores it."""

from dataclasses import replace
from datetime import timedelta

from scheduler.decisions import Dispatch, Fail, Requeue, StartLoad, Unload
from scheduler.policy import plan, plan_explained

from .builders import at, dep, loads, of, req, routed, server, snap


def test_nothing_is_routed_or_loaded_where_it_is_disabled():
    off = dep(1, 1, "m", "loaded", enabled=False, in_flight=1)
    other = dep(2, 2, "m")
    r = req("m")
    decisions = plan(snap([server(1, slots=4), server(2)], [off, other], [r]), at(0))
    assert routed(decisions) == {r.id: 2}
    assert loads(decisions) == [(2, ())]


def test_a_request_routed_there_goes_back_to_be_placed():
    off = dep(1, 1, "m", "loaded", enabled=False)
    other = dep(2, 2, "m", "loaded")
    r = req("m", state="ready", deployment_id=1)
    decisions = plan(snap([server(1), server(2)], [off, other], [r]), at(0))
    [back] = of(decisions, Requeue)
    assert back.reason == "m was disabled on s1"
    assert [d.deployment_id for d in of(decisions, Dispatch)] == [2]


def test_loaded_it_leaves_once_its_requests_there_finish_pinned_or_not():
    busy = dep(1, 1, "m", "loaded", enabled=False, pinned=True, in_flight=1)
    assert of(plan(snap([server(1, slots=2)], [busy], []), at(0)), Unload) == []
    idle = replace(busy, in_flight=0)
    [unload] = of(plan(snap([server(1)], [idle], []), at(0)), Unload)
    assert (unload.deployment_id, unload.reason) == (1, "disabled by an operator")


def test_with_no_other_home_its_requests_wait_saying_why_then_fail_fast():
    off = dep(1, 1, "m", enabled=False)
    r = req("m", age_s=5)
    explained = plan_explained(snap([server(1)], [off], [r], no_server_grace_s=15), at(0))
    assert loads(explained.decisions) == [] and of(explained.decisions, Fail) == []
    assert explained.reasons[r.id].text.startswith("no server can serve m: m is disabled on s1")
    later = plan(snap([server(1)], [off], [r], no_server_grace_s=15), at(0) + timedelta(seconds=11))
    [failed] = of(later, Fail)
    assert failed.code == "no_server_available" and "m is disabled on s1" in failed.message


def test_nothing_preloads_keeps_or_restores_it():
    preload = dep(1, 1, "m", enabled=False, preload=True)
    kept = dep(2, 2, "k", enabled=False, keep_loaded_hours="00:00-00:00")
    decisions = plan(snap([server(1), server(2)], [preload, kept], []), at(0))
    assert of(decisions, StartLoad) == []

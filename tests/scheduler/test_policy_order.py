"""One or more tests per policy rule (scheduler/README.md), on hand-built snapshots: the
order of the line (classes, first come first served within a class, aging, a request about
to expire first). What holds a switch back: test_policy_holds.py; routing and room:
test_policy_routing.py; failures: test_policy_failures.py.

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from dataclasses import replace

from scheduler.decisions import (
    Dispatch,
    Fail,
    Route,
    StartLoad,
    Unload,
)
from scheduler.policy import effective_priority, plan

from .builders import (
    BACKGROUND,
    HIGH,
    INTERACTIVE,
    NORMAL,
    at,
    dep,
    of,
    req,
    server,
    snap,
)

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

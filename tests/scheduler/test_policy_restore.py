"""Restore on idle (scheduler/README.md, "Restore on idle"), on hand-built snapshots: an
idle server that can stop a load loads back the model interactive work used lately, when
that pays, and what it restored gives way to any real request.

Pure: no database, no clock, no sleeps. Each test says what would break if it failed.
"""

from scheduler.decisions import StartLoad
from scheduler.policy import plan

from .builders import INTERACTIVE, NORMAL, at, dep, loads, of, req, server, snap


def idle_server(**fields):
    return server(1, llm=1, stops_loads=fields.pop("stops_loads", True), **fields)


def big(**fields):
    """A 90 s model interactive work used a minute ago, now unloaded."""
    fields.setdefault("last_interactive_at", at(-60))
    fields.setdefault("displaced", True)
    fields.setdefault("avg_load_s", 90.0)
    return dep(1, 1, "big", **fields)


def small(**fields):
    """A 5 s model normal work used ten minutes ago, loaded and idle."""
    fields.setdefault("last_priority", NORMAL)
    fields.setdefault("avg_load_s", 5.0)
    return dep(2, 1, "small", "loaded", **fields)


def test_an_idle_server_loads_back_what_interactive_work_used():
    """The next interactive request for `big` would wait 90 s; evicting `small` costs its
    next normal user 5 s. Breaks if idle servers sit on what nobody uses."""
    decisions = plan(snap([idle_server()], [big(), small()], []), at(0))
    assert loads(decisions) == [(1, (2,))]
    assert of(decisions, StartLoad)[0].reason == "restore: interactive work used big 60 s ago"


def test_no_restore_on_a_server_that_cannot_stop_a_load():
    """A restore must give way to real work at once; where a load cannot be stopped, it
    would hold the server's one load channel. Breaks if Ollama or LM Studio restore."""
    decisions = plan(snap([idle_server(stops_loads=False)], [big(), small()], []), at(0))
    assert loads(decisions) == []


def test_no_restore_while_the_server_works_or_someone_waits_for_it():
    """Running, routed or waiting work keeps the server as it is."""
    assert loads(plan(snap([idle_server()], [big(), small(in_flight=1)], []), at(0))) == []
    queued = req("small", NORMAL, state="ready", deployment_id=2)
    assert loads(plan(snap([idle_server()], [big(), small(in_flight=1)], [queued]), at(0))) == []
    waiting = req("small", NORMAL)
    assert loads(plan(snap([idle_server()], [big(), small()], [waiting]), at(0))) == []


def test_no_restore_of_what_we_did_not_evict():
    """Unloaded by an operator, its idle TTL or the server itself (not `displaced`): it
    stays unloaded. Breaks if an operator's unload were undone a pass later."""
    unloaded = big(displaced=False)
    assert loads(plan(snap([idle_server()], [unloaded, small()], []), at(0))) == []


def test_no_restore_of_a_model_loaded_elsewhere_or_not_used_lately():
    """Loaded on another server: nothing to restore. Used by interactive work over an hour
    ago (`restore_window_s`), or past its idle TTL: no restore (it would undo the TTL)."""
    elsewhere = dep(3, 2, "big", "loaded")
    both = [idle_server(), server(2)]
    assert loads(plan(snap(both, [big(), small(), elsewhere], []), at(0))) == []
    old = big(last_interactive_at=at(-3601))
    assert loads(plan(snap([idle_server()], [old, small()], []), at(0))) == []
    assert loads(plan(snap([idle_server()], [big(idle_ttl_s=30.0), small()], []), at(0))) == []
    assert loads(plan(snap([idle_server()], [big(), small()], [], restore_window_s=0), at(0))) == []


def test_a_restore_pays_several_times_its_victims():
    """`small` used by interactive work 40 s ago, 40 s to reload: 8 · 40 / 40 = 8 a second
    against 8 · 90 / 60 = 12 for `big`: more, but not four times more. Breaks if a guess
    evicts a model in use."""
    warm = small(avg_load_s=40.0, last_interactive_at=at(-40), last_used_at=at(-40))
    assert loads(plan(snap([idle_server()], [big(), warm], []), at(0))) == []
    cold = small(avg_load_s=40.0, last_interactive_at=at(-600), last_used_at=at(-600))
    assert loads(plan(snap([idle_server()], [big(), cold], []), at(0))) == [(1, (2,))]


def test_a_restore_evicts_nothing_within_its_minimum_residency():
    """`small` loaded 2 s ago and used by background work: it keeps its residency (5 s,
    its reload), though restoring `big`, used 5 s ago, pays."""
    fresh = small(loaded_at=at(-2), last_used_at=at(-1), last_priority=3)
    recent = big(last_interactive_at=at(-5))
    assert loads(plan(snap([idle_server()], [recent, fresh], []), at(0))) == []
    unheld = snap([idle_server()], [recent, fresh], [], min_residency_s=0)
    assert loads(plan(unheld, at(0))) == [(1, (2,))]


def test_a_restored_model_nobody_used_keeps_no_residency():
    """`big`, restored 5 s ago and not used since, is evicted at once for a normal request
    (a used model that fresh would be held for its minimum residency). Breaks if a guess
    makes real work wait."""
    before = {"last_priority": INTERACTIVE, "last_interactive_at": at(-30)}  # its last use
    restored = big(
        state="loaded", loaded_at=at(-5), last_used_at=at(-5), load_cause="restore", **before
    )
    other = dep(2, 1, "small", avg_load_s=5.0)
    r = req("small", NORMAL)
    assert loads(plan(snap([idle_server()], [restored, other], [r]), at(0))) == [(2, (1,))]
    used = big(
        state="loaded", loaded_at=at(-5), last_used_at=at(-1), load_cause="restore", **before
    )
    assert loads(plan(snap([idle_server()], [used, other], [r]), at(0))) == []

"""Keep-loaded hours in the policy (pure): within them an idle server loads the model,
evicting only idle models nobody waits for, and its idle TTL waits; outside them nothing
happens, and the pass wakes when they begin. T0 is Thursday 2026-01-01 12:00 UTC."""

from datetime import UTC, datetime

from scheduler.decisions import StartLoad, Unload
from scheduler.policy import plan

from .builders import at, defer, dep, loads, of, req, server, snap

WORKDAY = "mon-fri 09:00-17:00"


def test_within_its_hours_an_idle_server_loads_it_with_the_reason():
    d = dep(1, 1, "chat", keep_loaded_hours=WORKDAY)
    decisions = plan(snap([server(1)], [d], []), at(0))
    [load] = of(decisions, StartLoad)
    assert (load.deployment_id, load.evict, load.cause) == (1, (), "preload")
    assert "keep-loaded hours mon-fri 09:00-17:00" in load.reason
    assert defer(decisions).until == datetime(2026, 1, 1, 17, 0, tzinfo=UTC)  # the hours end


def test_outside_its_hours_nothing_loads_and_the_pass_wakes_when_they_begin():
    d = dep(1, 1, "chat", keep_loaded_hours="mon-fri 13:00-17:00")
    decisions = plan(snap([server(1)], [d], []), at(0))
    assert loads(decisions) == []
    assert defer(decisions).until == datetime(2026, 1, 1, 13, 0, tzinfo=UTC)
    weekend = dep(1, 1, "chat", keep_loaded_hours="sat+sun 00:00-00:00")
    decisions = plan(snap([server(1)], [weekend], []), at(0))
    assert loads(decisions) == []
    assert defer(decisions).until == datetime(2026, 1, 3, 0, 0, tzinfo=UTC)


def test_the_hours_are_read_in_the_teams_time_zone():
    """12:00 UTC is 21:00 in Tokyo: outside 09:00-17:00 there, inside in UTC."""
    d = dep(1, 1, "chat", keep_loaded_hours=WORKDAY)
    assert loads(plan(snap([server(1)], [d], [], time_zone="Asia/Tokyo"), at(0))) == []
    assert loads(plan(snap([server(1)], [d], [], time_zone="UTC"), at(0))) == [(1, ())]


def test_it_evicts_an_idle_model_nobody_waits_for():
    idle = dep(2, 1, "old", "loaded", last_used_at=at(-600))
    d = dep(1, 1, "chat", keep_loaded_hours=WORKDAY)
    assert loads(plan(snap([server(1)], [idle, d], []), at(0))) == [(1, (2,))]


def test_it_evicts_nothing_busy_wanted_resident_pinned_or_kept_itself():
    d = dep(1, 1, "chat", keep_loaded_hours=WORKDAY)
    stale = {"last_used_at": at(-600)}
    cases = [
        ([dep(2, 1, "b", "loaded", in_flight=1, **stale)], []),
        ([dep(2, 1, "b", "loaded", **stale)], [req("b", not_before=at(30))]),  # wanted
        ([dep(2, 1, "b", "loaded", loaded_at=at(-5), last_used_at=at(-5))], []),  # residency
        ([dep(2, 1, "b", "loaded", pinned=True, **stale)], []),
        ([dep(2, 1, "b", "loaded", preload=True, **stale)], []),
        ([dep(2, 1, "b", "loaded", keep_loaded_hours="09:00-17:00", **stale)], []),
    ]
    for victims, requests in cases:
        assert loads(plan(snap([server(1)], [*victims, d], requests), at(0))) == [], victims


def test_it_waits_while_requests_are_routed_to_its_server():
    """The server's next load is theirs."""
    loading = dep(2, 1, "b", "loading", load_started_at=at(-1))
    d = dep(1, 1, "chat", keep_loaded_hours=WORKDAY)
    routed = req("b", state="needs_loading", deployment_id=2)
    decisions = plan(snap([server(1, llm=2)], [loading, d], [routed]), at(0))
    assert of(decisions, StartLoad) == []


def test_its_idle_ttl_waits_for_the_end_of_its_hours():
    idle = {"idle_ttl_s": 60, "last_used_at": at(-600)}
    d = dep(1, 1, "chat", "loaded", keep_loaded_hours=WORKDAY, **idle)
    assert of(plan(snap([server(1)], [d], []), at(0)), Unload) == []
    after = datetime(2026, 1, 1, 17, 0, tzinfo=UTC)
    [unload] = of(plan(snap([server(1)], [d], []), after), Unload)
    assert unload.deployment_id == 1


def test_hours_that_do_not_parse_keep_nothing_loaded():
    """The admin refuses them; a row written around it must not stop the worker."""
    d = dep(1, 1, "chat", keep_loaded_hours="whenever")
    assert loads(plan(snap([server(1)], [d], []), at(0))) == []

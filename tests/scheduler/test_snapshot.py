"""The snapshot the policy plans on: every waiting request when the line is short; with a
deep line, the best-ranked, the oldest (where aging and expiry happen) and the routed."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from scheduler import store
from scheduler.models import Priority, Request, State
from tests import factories
from tests.support.table_reads import entries_read_by, unvacuumed  # noqa: F401 (fixture)
from tests.support.wire import queries_sent

pytestmark = pytest.mark.django_db


def waiting_ids(snapshot) -> set:
    return {r.id for r in snapshot.requests}


def test_a_short_line_is_read_whole() -> None:
    requests = [factories.request("m", priority=p) for p in Priority]
    factories.request("m", state=State.COMPLETED)

    snapshot = store.SnapshotReader().read(store.policy_config())

    assert waiting_ids(snapshot) == {r.id for r in requests}


def test_a_server_stops_loads_as_its_kind_can() -> None:
    """`ServerView.stops_loads` is its adapter's: the policy stops a load nobody waits for
    only where the server can stop it."""
    for name, kind in (("sim", "simulated"), ("lcpp", "llamacpp"), ("oai", "openai")):
        factories.server(name, kind=kind, base_url="http://127.0.0.1:1")

    snapshot = store.SnapshotReader().read(store.policy_config())

    stops = {s.name: s.stops_loads for s in snapshot.servers}
    assert stops == {"sim": True, "lcpp": True, "oai": False}


def test_a_server_is_read_with_its_counts_and_budget() -> None:
    """Each limit the eviction rule counts reaches the policy (the count in all, too)."""
    factories.server("a", max_llm=2, max_embedding=0, max_models=2, memory_mb=8000)
    factories.server("b")

    servers = {s.name: s for s in store.SnapshotReader().read(store.policy_config()).servers}

    assert (servers["a"].capacity, servers["a"].max_models, servers["a"].memory_mb) == (
        {"llm": 2, "embedding": 0, "reranking": 1},
        2,
        8000,
    )
    assert (servers["b"].max_models, servers["b"].memory_mb) == (None, None)


def test_a_deep_line_keeps_the_best_the_oldest_and_the_routed(monkeypatch) -> None:
    monkeypatch.setattr(store.snapshots, "SNAPSHOT_HEAD", 2)
    long_ago = timezone.now() - timedelta(hours=1)
    oldest = factories.request("m", priority=Priority.BACKGROUND, created_at=long_ago)
    routed = factories.request(
        "m",
        priority=Priority.BACKGROUND,
        state=State.NEEDS_LOADING,
        created_at=long_ago + timedelta(minutes=30),
    )
    middle = [
        factories.request("m", priority=Priority.NORMAL, created_at=long_ago + timedelta(minutes=m))
        for m in range(2, 6)
    ]
    best = [factories.request("m", priority=Priority.INTERACTIVE) for _ in range(2)]

    snapshot = store.SnapshotReader().read(store.policy_config())

    # Two best, the two oldest, the two oldest routed (the one routed fills that query).
    assert waiting_ids(snapshot) == {r.id for r in [*best, oldest, middle[0], routed]}
    # Those found by another ordering than the best come whole, like the best.
    seen = {r.id: r for r in snapshot.requests}
    for request in (oldest, routed):
        request.refresh_from_db()
        view = seen[request.id]
        assert (view.model, view.priority, view.state) == ("m", Priority.BACKGROUND, request.state)
        assert (view.created_at, view.expires_at) == (request.created_at, request.expires_at)


def busy_deep_line(monkeypatch, model_head: int, other: str) -> list[Request]:
    """A line deeper than the snapshot's head, at test scale: six old requests for `busy`,
    deployed with `other` on one server."""
    monkeypatch.setattr(store.snapshots, "SNAPSHOT_HEAD", 2)
    monkeypatch.setattr(store.snapshots, "MODEL_HEAD", model_head)
    server = factories.server("s1")
    factories.deployment(server, "busy")
    factories.deployment(server, other)
    long_ago = timezone.now() - timedelta(hours=1)
    return [factories.request("busy", created_at=long_ago + timedelta(seconds=s)) for s in range(6)]


def test_a_deep_line_keeps_the_best_of_each_deployed_model(monkeypatch) -> None:
    ahead = busy_deep_line(monkeypatch, 1, "other")
    behind = [factories.request("other") for _ in range(2)]
    factories.request("undeployed")

    snapshot = store.SnapshotReader().read(store.policy_config())

    # The best two overall and the oldest are all `busy`; `other` still has its best.
    assert waiting_ids(snapshot) == {r.id for r in [*ahead[:2], behind[0]]}


def test_a_deep_line_tells_which_models_more_requests_may_wait_for(monkeypatch) -> None:
    """A model whose own head came full may have more waiting than the snapshot holds;
    one whose head came short has them all there (what sends on arrival rely on)."""
    busy_deep_line(monkeypatch, 2, "lone")
    lone = factories.request("lone")
    reader = store.SnapshotReader()

    snapshot = reader.read(store.policy_config())

    assert lone.id in waiting_ids(snapshot)
    assert snapshot.unseen == {"busy"}
    Request.objects.filter(model__name="busy").delete()
    assert reader.read(store.policy_config()).unseen == frozenset()  # all of it, whole


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="round trips are PostgreSQL's")
def test_a_deep_line_is_read_in_one_round_trip_once_seen_deep(monkeypatch) -> None:
    monkeypatch.setattr(store.snapshots, "SNAPSHOT_HEAD", 2)
    monkeypatch.setattr(store.snapshots, "MODEL_HEAD", 1)
    server = factories.server("s1")
    factories.deployment(server, "busy")
    long_ago = timezone.now() - timedelta(hours=1)
    ahead = [
        factories.request("busy", created_at=long_ago + timedelta(seconds=s)) for s in range(4)
    ]
    behind = factories.request("other")
    reader = store.SnapshotReader()
    read: list = []

    def trips() -> int:
        sent = queries_sent(lambda: read.append(reader.read(store.policy_config())))
        # Not counted: a connection's first use of the hot statements prepares them, once.
        return len([q for q in sent if not q.startswith("PREPARE")])

    # Found deep: its other heads are read after the best; the next pass reads them along.
    first, again = trips(), trips()
    assert (first, again) == (2, 1)
    assert waiting_ids(read[0]) == waiting_ids(read[1]) == {r.id for r in ahead[:2]}
    # A model deployed meanwhile has a head the last read did not ask for: read afresh.
    factories.deployment(server, "other")
    assert trips() == 3  # and its best request is a row not read yet: a trip more
    assert waiting_ids(read[2]) == {r.id for r in [*ahead[:2], behind]}
    assert trips() == 2  # the heads' ids go along; that row, outside the best, comes after
    assert waiting_ids(read[3]) == waiting_ids(read[2])
    # A line grown short again is read whole, as one.
    for request in [*ahead, behind]:
        request.state = State.CANCELLED
        request.save()
    assert trips() == 1
    assert reader.deep_models is None


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="PostgreSQL's scans and statistics")
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("unvacuumed")
def test_a_pass_does_not_read_again_the_requests_that_moved_on() -> None:
    waiting = [factories.request("m") for _ in range(3)]
    moved = [factories.request("m") for _ in range(500)]
    Request.objects.filter(pk__in=[r.pk for r in moved]).update(state=State.COMPLETED)
    reader = store.SnapshotReader()
    reader.read(store.policy_config())  # passes their stale entries once, and marks them

    snapshot, read = entries_read_by(lambda: reader.read(store.policy_config()))

    assert waiting_ids(snapshot) == {r.id for r in waiting}
    # The best-ranked waiting, not every request the waiting index ever held.
    assert 0 < read < 50


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="PostgreSQL's planner")
def test_no_statement_of_a_snapshot_is_planned_as_a_disabled_scan() -> None:
    """Read in index order (sequential and bitmap scans off), a statement that no index can
    serve is still planned, as a disabled scan at a cost so high that PostgreSQL compiles
    it first (JIT): 14 ms on every pass."""
    with connection.cursor() as cursor:
        for setting, _ in store.IN_INDEX_ORDER:
            cursor.execute(setting)
        cursor.execute("SHOW jit_above_cost")
        [(jit_above,)] = cursor.fetchall()
        for statement, params in store.pass_reads():
            cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
            [([plan],)] = cursor.fetchall()
            assert plan["Plan"]["Total Cost"] < float(jit_above), statement


def test_views_hold_what_the_rows_hold_as_the_policy_compares_it() -> None:
    """Read as SQL, not through the ORM: keys are UUIDs and timestamps carry their zone on
    every database, so the policy can compare them with its clock."""
    now = timezone.now()
    server = factories.server("s1", slots=3, max_embedding=2, cooldown_until=now)
    deployment = factories.deployment(
        server,
        "m1",
        state="loaded",
        loaded_at=now,
        pinned=True,
        in_flight=1,
        idle_ttl_s=60,
        keep_loaded_hours="mon-fri 08:00-18:00",
    )
    request = factories.request("m1", priority=Priority.INTERACTIVE, deployment=deployment)

    snapshot = store.SnapshotReader().read(store.policy_config())

    [s] = snapshot.servers
    assert (s.id, s.name, s.slots, s.enabled, s.health) == (server.pk, "s1", 3, True, "up")
    assert s.capacity == {"llm": 1, "embedding": 2, "reranking": 1}
    assert s.cooldown_until == now
    [d] = snapshot.deployments
    assert (d.id, d.server_id, d.model, d.model_type, d.state) == (
        deployment.pk,
        server.pk,
        "m1",
        "llm",
        "loaded",
    )
    assert (d.in_flight, d.pinned, d.preload, d.idle_ttl_s, d.loaded_at) == (
        1,
        True,
        False,
        60,
        now,
    )
    assert d.keep_loaded_hours == "mon-fri 08:00-18:00"
    [r] = snapshot.requests
    assert (r.id, r.model, r.priority, r.state, r.deployment_id) == (
        request.pk,
        "m1",
        Priority.INTERACTIVE,
        State.PENDING,
        deployment.pk,
    )
    assert (r.created_at, r.expires_at, r.not_before) == (
        request.created_at,
        request.expires_at,
        None,
    )
    assert r.expires_at - now > timedelta(minutes=5)  # aware: comparable with the clock

"""The statements a request costs. On PostgreSQL each one is a round trip to the database
server (a few tenths of a millisecond on a 2-core machine, the largest share of a request's
latency), so reads that can go together go in one query, and writes whose results nobody
reads go with a transaction's last one, and with its COMMIT (its BEGIN rides on its first
statement: config/postgresql). On SQLite they run in turn: there is no trip."""

import re

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from backends.models import DeploymentState
from scheduler import sql, store
from scheduler.api import intake
from scheduler.api.queue_bound import queue_bound
from scheduler.decisions import Dispatch, Route
from scheduler.models import Request, State, Trace, Worker
from scheduler.policy import plan
from scheduler.runtime import Runtime
from scheduler.runtime.execution import Home, homes, transition_for
from tests import factories
from tests.support.wire import queries_sent

POSTGRES = settings.IS_POSTGRES
BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def sent(captured: CaptureQueriesContext) -> list[str]:
    """The statements sent, as the connection saw them: BEGIN and COMMIT aside, and the
    savepoints that stand for them inside a test's transaction."""
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def statements(work) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        work()
    return sent(captured)


@pytest.mark.django_db
def test_fetch_all_reads_each_query_in_order_in_one_round_trip():
    factories.server("s1")
    factories.server("s2")
    queries = [
        ("SELECT name FROM backends_server WHERE name = %s", ["s2"]),
        ("SELECT name FROM backends_server ORDER BY name", []),
        ("SELECT name FROM backends_server WHERE name = %s", ["none"]),
    ]
    sent: list = []
    sent.extend(statements(lambda: sent.append(sql.fetch_all(queries))))
    rows, *queries_sent = sent
    assert rows == [[("s2",)], [("s1",), ("s2",)], []]
    assert len(queries_sent) == (1 if POSTGRES else 3)


@pytest.mark.django_db
def test_writes_at_end_holds_writes_until_its_end_and_sends_them_together():
    server = factories.server("s1")
    rename = "UPDATE backends_server SET name = %s WHERE id = %s"
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        with sql.writes_at_end():
            sql.write_later(rename, ["s2", server.pk])
            with sql.writes_at_end():  # nested: the outermost sends
                sql.write_later(rename, ["s3", server.pk])
            assert not sent(captured)
            assert sql.fetch("SELECT name FROM backends_server")[0][0] == "s1"
        after = sql.fetch("SELECT name FROM backends_server")[0][0]
    assert after == "s3"  # in order
    writes = [s for s in sent(captured) if s.startswith("UPDATE")]
    assert len(writes) == (1 if POSTGRES else 2)

    sql.write_later(rename, ["s4", server.pk])  # outside one: at once
    assert sql.fetch("SELECT name FROM backends_server")[0][0] == "s4"


@pytest.mark.django_db
def test_writes_at_end_sends_nothing_when_its_work_fails():
    server = factories.server("s1")
    with pytest.raises(RuntimeError), transaction.atomic(), sql.writes_at_end():
        sql.write_later("UPDATE backends_server SET name = 'x' WHERE id = %s", [server.pk])
        raise RuntimeError("the transaction rolls back")
    sql.write_later("UPDATE backends_server SET slots = 3 WHERE id = %s", [server.pk])
    server.refresh_from_db()
    assert (server.name, server.slots) == ("s1", 3)  # the held write went nowhere


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_arrival", [False, True], ids=["by-a-pass", "on-arrival"])
def test_one_request_costs_five_round_trips_on_postgresql_four_if_sent_on_arrival(
    monkeypatch, on_arrival
):
    """Its insert (which looks up the model's id itself), the snapshot, the pass that
    routes and sends it (its rows read under lock, then written with the commit), and its
    completion: each with every trace row, counter and setting it writes, BEGIN and COMMIT
    included, counted on the wire. Sent on arrival, it needs no snapshot. (The queue
    bound's count, at most once a second, is taken before; a connection's first use of a
    hot statement prepares it, once.)"""
    factories.model("m1")
    monkeypatch.setattr(queue_bound, "clock", lambda: 0.0)
    queue_bound.count()
    d = factories.deployment(factories.server("s1", slots=2), "m1", state=DeploymentState.LOADED)
    worker = Worker.objects.create(host="a", pid=1)
    runtime = Runtime()
    found: dict = {}

    def accept() -> None:
        found["request"] = intake.accept("chat", BODY, caller_waits=True).pk

    def a_pass() -> None:
        snapshot = store.SnapshotReader().read(store.policy_config())
        runtime.server_of = homes(snapshot)
        found["plan"] = plan(snapshot, runtime.clock())

    def route_and_send() -> None:
        moves = [t for d in found["plan"] if (t := transition_for(d, runtime.server_of))]
        sends = [(d.request_id, d.deployment_id) for d in found["plan"] if isinstance(d, Dispatch)]
        found["job"] = store.move_and_dispatch(moves, sends, worker.pk)[1][0]

    def send_on_arrival() -> None:
        request_id = found["request"]
        route = transition_for(Route(request_id, d.pk, True, "sent on arrival"), runtime.server_of)
        found["job"] = store.send_on_arrival([route], [(request_id, d.pk)], worker.pk)[0]

    def complete() -> None:
        store.requests_completed([store.Answer(found["job"], {"ok": True}, 0.1)])

    trips = queries_sent if POSTGRES else statements
    runtime.server_of = {d.pk: Home(d.server_id, "s1")}
    steps = (
        [accept, send_on_arrival, complete]
        if on_arrival
        else [accept, a_pass, route_and_send, complete]
    )
    first = [trips(step) for step in steps]
    again = [trips(step) for step in steps]

    assert Request.objects.count() == 2
    for request in Request.objects.all():
        assert request.state == State.COMPLETED
        assert request.deployment_id == d.pk
        traced = Trace.objects.filter(request=request).values_list("to_state", flat=True)
        assert list(traced.order_by("id")) == [State.READY, State.PROCESSING, State.COMPLETED]
    if POSTGRES:
        assert [len(sent) for sent in again] == ([1, 2, 1] if on_arrival else [1, 1, 2, 1])
        # The first time, if this connection had not run them yet, a trip more for each
        # batch of statements prepared.
        for sent, later in zip(first, again, strict=True):
            prepares = [q for q in sent if q.startswith("PREPARE")]
            assert len(sent) - len(later) == len(prepares)
        # Of the requests table, only inserts and statements that find a row by its key
        # alone are prepared: a cached plan of a read made while the table was small would
        # outlive its growth, or use another index its conditions name.
        table = Request._meta.db_table
        sent_together = sql.fetch("SELECT statement FROM pg_prepared_statements")
        parts = [part for (text,) in sent_together for part in text.split("; ")]
        on_requests = [part for part in parts if f" {table} " in part]
        assert on_requests
        mention = rf"(?:FROM|UPDATE) {table} "
        unindexed = r"\([^()]*\) IS NOT DISTINCT FROM \([^()]*\)"
        by_key = rf"{mention}[^()]*?WHERE id = \$\d+( AND {unindexed})?( FOR NO KEY UPDATE)?(\)|$)"
        for part in on_requests:
            if f" AS INSERT INTO {table} " not in part:
                assert len(re.findall(by_key, part)) == len(re.findall(mention, part)), part
        # Sent on arrival, once its connections have prepared them, no statement of a
        # request's is planned again: all go by name. (A pass reads the head of the line as
        # text, on purpose: see store.HEAD_SQL.)
        if on_arrival:
            planned = [q for sent in again for q in sent if re.search(rf"\b{table}\b", q)]
            assert planned == []
    else:
        assert sum(len(sent) for sent in again) > 8

"""Storing why requests wait: only what changed, in one UPDATE and one INSERT per pass."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler import reasons, transitions
from scheduler.models import Request, State, Trace
from scheduler.policy import plan_explained
from scheduler.store import ReasonWriter, SnapshotReader, policy_config, write_reasons
from tests import factories

pytestmark = pytest.mark.django_db


def behind(n: int) -> reasons.Reason:
    return reasons.make(reasons.BEHIND, f"behind {n} normal requests on s1", server="s1")


HELD = reasons.make(reasons.HELD, "held: switch on s1 batched until 12:00:06", server="s1")


def reasons_traced(request) -> list[str]:
    return list(
        Trace.objects.filter(request=request).order_by("at", "id").values_list("reason", flat=True)
    )


def test_the_writer_gives_a_reason_once_as_long_as_it_stays():
    writer = ReasonWriter()
    a, b = factories.request("m").pk, factories.request("m").pk
    assert writer.changed({a: behind(3), b: HELD}) == {a: behind(3), b: HELD}
    assert writer.changed({a: behind(3), b: HELD}) == {}
    assert writer.changed({a: behind(2), b: HELD}) == {a: behind(2)}
    # b left the snapshot's view (sent, or behind the heads): forgotten, given anew.
    assert writer.changed({a: behind(2)}) == {}
    assert writer.changed({a: behind(2), b: HELD}) == {b: HELD}


def test_a_new_kind_of_reason_is_traced_a_line_moving_forward_is_not():
    """A line moving forward ("behind 3" → "behind 2") changes the field, not the trace."""
    r = factories.request("m")
    writer = ReasonWriter()
    for step in (behind(3), behind(2), HELD, behind(1)):
        write_reasons(writer.changed({r.pk: step}))
    r.refresh_from_db()
    assert r.reason["text"] == "behind 1 normal requests on s1"
    assert reasons_traced(r) == [behind(3).text, HELD.text, behind(1).text]


def test_a_reason_whose_numbers_alone_move_is_stored_not_traced():
    """A busy model running dry ("finishes the 4 running", then 3, 2, 1): one trace row; a
    new server is news."""
    r = factories.request("m")
    writer = ReasonWriter()

    def no_room(server: str, running: int) -> reasons.Reason:
        text = f"no load of m can start now: {server} first finishes the {running} running on a"
        return reasons.make(reasons.NO_ROOM, text, server=server)

    for step in (no_room("s1", 4), no_room("s1", 3), no_room("s1", 1), no_room("s2", 1)):
        write_reasons(writer.changed({r.pk: step}))
    r.refresh_from_db()
    assert r.reason["text"] == no_room("s2", 1).text
    assert reasons_traced(r) == [no_room("s1", 4).text, no_room("s2", 1).text]


def test_two_workers_store_and_trace_the_same_reason_once():
    """Each worker explains every waiting request; the second finds the reason stored (so
    does a worker restarted, its memory empty)."""
    r = factories.request("m")
    one, two = ReasonWriter(), ReasonWriter()
    write_reasons(one.changed({r.pk: HELD}))
    write_reasons(two.changed({r.pk: HELD}))
    write_reasons(ReasonWriter().changed({r.pk: HELD}))
    write_reasons(two.changed({r.pk: behind(2)}))
    write_reasons(one.changed({r.pk: behind(1)}))
    r.refresh_from_db()
    assert r.reason["text"] == behind(1).text
    assert reasons_traced(r) == [HELD.text, behind(2).text]


def test_a_request_that_waits_again_is_told_why_again():
    """A move out of the waiting states clears the reason: sent back later, the same
    reason is stored and traced anew, and no stale one is shown meanwhile."""
    r = factories.request("m", state=State.READY)
    writer = ReasonWriter()
    write_reasons(writer.changed({r.pk: HELD}))
    assert transitions.move(r.pk, [State.READY], State.PROCESSING, "sent to the server")
    r.refresh_from_db()
    assert r.reason is None
    assert transitions.move(r.pk, [State.PROCESSING], State.PENDING, "its worker stopped")
    write_reasons(ReasonWriter().changed({r.pk: HELD}))
    assert reasons_traced(r) == [HELD.text, "sent to the server", "its worker stopped", HELD.text]


def updates_and_inserts(queries) -> tuple[int, int]:
    """The UPDATEs of the reason field and the INSERTs of trace rows sent."""
    text = " ; ".join(q["sql"] for q in queries).replace('"', "")
    return (
        text.count(f"UPDATE {Request._meta.db_table} SET reason"),
        text.count(f"INSERT INTO {Trace._meta.db_table}"),
    )


def test_a_pass_of_reasons_is_one_update_and_one_insert():
    line = [factories.request("m", state=State.READY) for _ in range(30)]
    writer = ReasonWriter()
    changes = writer.changed({r.pk: behind(i) for i, r in enumerate(line)})
    with CaptureQueriesContext(connection) as captured:
        write_reasons(changes)
    assert updates_and_inserts(captured.captured_queries) == (1, 1)
    stored = Request.objects.get(pk=line[3].pk)
    assert stored.reason == {
        "kind": "behind",
        "text": "behind 3 normal requests on s1",
        "details": {"server": "s1"},
    }
    trace = Trace.objects.filter(request=line[3]).get()
    assert (trace.from_state, trace.to_state, trace.server, trace.reason) == (
        "ready",
        "ready",
        "s1",
        "behind 3 normal requests on s1",
    )


def test_a_request_no_longer_waiting_is_left_alone():
    gone = factories.request("m", state=State.PROCESSING)
    write_reasons(ReasonWriter().changed({gone.pk: HELD}))
    gone.refresh_from_db()
    assert gone.reason is None and not Trace.objects.filter(request=gone).exists()


def test_reasons_of_a_real_snapshot_are_stored_once():
    """A request for a model whose server is down: its reason is written at the first pass
    and not again while it stays the same."""
    down = factories.server("s1", health="down")
    factories.deployment(down, "m")
    r = factories.request("m")
    reader, writer = SnapshotReader(), ReasonWriter()

    def one_pass() -> int:
        planned = plan_explained(reader.read(policy_config()), r.created_at)
        changes = writer.changed(planned.reasons)
        if changes:
            write_reasons(changes)
        return len(changes)

    assert one_pass() == 1
    assert one_pass() == 0
    r.refresh_from_db()
    assert r.reason["kind"] == "no_server"
    assert r.reason["text"].startswith("no server can serve m: s1 is down; fails at ")
    assert Trace.objects.filter(request=r).count() == 1

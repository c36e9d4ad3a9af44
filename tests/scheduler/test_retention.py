"""Finished requests are deleted after SWITCHYARD_KEEP_FINISHED_DAYS; nothing else is."""

import asyncio
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from scheduler import retention, runtime
from scheduler.models import Callback, Request, State, Trace
from tests import factories

pytestmark = pytest.mark.django_db


def finished(days_ago: float, state: str = State.COMPLETED) -> Request:
    at = timezone.now() - timedelta(days=days_ago)
    r = factories.request("m", state=state, finished_at=at)
    Request.objects.filter(pk=r.pk).update(created_at=at - timedelta(seconds=5))
    Trace.objects.create(request=r, from_state=State.PROCESSING, to_state=state, reason="end")
    return r


def waiting_since(days_ago: float, state: str = State.PENDING) -> Request:
    r = factories.request("m", state=state)
    at = timezone.now() - timedelta(days=days_ago)
    Request.objects.filter(pk=r.pk).update(created_at=at, started_at=at)
    Trace.objects.create(request=r, to_state=state, reason="accepted")
    return r


def left() -> set:
    return set(Request.objects.values_list("pk", flat=True))


def test_requests_finished_before_the_cutoff_go_with_their_traces_and_nothing_else():
    old = [finished(40, state) for state in (State.COMPLETED, State.FAILED, State.EXPIRED)]
    old.append(finished(31, State.CANCELLED))
    recent = finished(29)
    unfinished = [waiting_since(90, s) for s in (State.PENDING, State.READY, State.PROCESSING)]

    purged = retention.purge_finished(timezone.now() - timedelta(days=30), chunk=3)

    assert purged == len(old)  # over two chunks
    assert left() == {recent.pk, *(r.pk for r in unfinished)}
    assert not Trace.objects.filter(request_id__in=[r.pk for r in old]).exists()
    assert Trace.objects.count() == 1 + len(unfinished)


@pytest.mark.django_db(transaction=True)
def test_a_request_with_a_callback_goes_with_it():
    """Committed, as the worker's purge is: a callback row left behind would refuse the
    commit on PostgreSQL (its key names the request), and hold retention back for good."""
    old = finished(40)
    Callback.objects.create(request=old, status=Callback.Status.DELIVERED)
    assert retention.purge_finished(timezone.now() - timedelta(days=30)) == 1
    assert left() == set() and not Callback.objects.exists()


def test_a_bounded_purge_stops_after_its_chunks_oldest_first():
    oldest, older, old = finished(50), finished(45), finished(40)
    before = timezone.now() - timedelta(days=30)

    assert retention.purge_finished(before, chunk=2, chunks=1) == 2
    assert left() == {old.pk}
    assert oldest.pk not in left() and older.pk not in left()


def test_keep_days_zero_keeps_everything(knobs):
    knobs(KEEP_FINISHED_DAYS=0)
    kept = finished(4000)
    assert retention.cutoff() is None
    assert retention.purge_due(chunks=10) == 0
    assert left() == {kept.pk}


def test_the_command_counts_on_a_dry_run_then_deletes(knobs):
    knobs(KEEP_FINISHED_DAYS=30)
    finished(10), finished(12)
    recent = finished(1)

    out = StringIO()
    call_command("purge_finished", "--days", "7", "--dry-run", stdout=out)
    assert "2 requests finished more than 7 days ago" in out.getvalue()
    assert len(left()) == 3

    call_command("purge_finished", "--days", "7", stdout=out)
    assert "deleted 2 requests" in out.getvalue()
    assert left() == {recent.pk}

    call_command("purge_finished", stdout=out)  # the setting's 30 days: nothing that old
    assert "deleted 0 requests" in out.getvalue()
    with pytest.raises(CommandError, match="more than 0"):
        call_command("purge_finished", "--days", "0")


@pytest.mark.django_db(transaction=True)
def test_the_worker_purges_a_chunk_at_a_time_until_the_backlog_is_gone(knobs, monkeypatch):
    knobs(KEEP_FINISHED_DAYS=30)
    monkeypatch.setattr(retention, "PURGE_CHUNK", 2)
    finished(40), finished(41), finished(42)
    recent = finished(1)
    worker = runtime.Runtime()

    async def look() -> float:
        await worker.purge_if_due()
        return worker.next_purge

    due_at = asyncio.run(look())  # a full chunk: more may wait, so the next heartbeat looks
    assert len(left()) == 2
    assert due_at <= time.monotonic()
    due_at = asyncio.run(look())  # the last one: then a pause
    assert left() == {recent.pk}
    assert due_at - time.monotonic() > runtime.PURGE_EVERY_S - 5
    asyncio.run(look())  # not due: nothing read, nothing changes
    assert worker.next_purge == due_at

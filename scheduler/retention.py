"""How long finished requests are kept: their rows and traces go after
`SWITCHYARD_KEEP_FINISHED_DAYS` (0 keeps them forever).

Every read of the requests table that the hot path makes walks a partial index of waiting
requests, so the finished ones cost it nothing; but the admin's lists, the metrics' counts
and the disk grow with them. The worker purges a chunk at a time (each its own short
transaction, read through the index of finished requests), oldest first."""

import itertools
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from access import usage

from . import metric_totals, sql
from .models import TERMINAL_STATES, Callback, MetricEvent, Request, Trace

log = logging.getLogger(__name__)
PURGE_CHUNK = 500  # ids in one IN list, within SQLite's limit on parameters
REQUESTS = Request._meta.db_table
TRACES = Trace._meta.db_table
CALLBACKS = Callback._meta.db_table


def keep_days() -> float:
    return settings.SWITCHYARD["KEEP_FINISHED_DAYS"]


def cutoff(days: float | None = None) -> datetime | None:
    """Requests that finished before this go (`days` ago, by default the setting's); None
    when they are kept forever."""
    days = keep_days() if days is None else days
    if days <= 0:
        return None
    return timezone.now() - timedelta(days=days)


def finished_before(before: datetime) -> int:
    return Request.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=before).count()


def purge_finished(before: datetime, chunk: int = PURGE_CHUNK, chunks: int | None = None) -> int:
    """Delete the requests that finished before `before`, with their traces and callbacks,
    `chunk` at a time (at most `chunks` of them). A waiting or running request is never touched,
    however old. Returns how many went."""
    purged = 0
    for _ in itertools.repeat(None) if chunks is None else range(chunks):
        with transaction.atomic():
            ids = list(
                Request.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=before)
                .order_by("finished_at", "created_at")  # the index of finished, backwards
                .values_list("id", flat=True)[:chunk]
            )
            if ids:
                metric_totals.carry_purged_requests(ids)  # counters never go down
                usage.fold(ids)  # each API key's usage outlives its requests
                keys = sql.keys(Request, ids)
                where = f"IN ({sql.marks(len(keys))})"
                sql.execute(f"DELETE FROM {TRACES} WHERE request_id {where}", keys)
                sql.execute(f"DELETE FROM {CALLBACKS} WHERE request_id {where}", keys)
                purged += sql.execute(f"DELETE FROM {REQUESTS} WHERE id {where}", keys)
        if len(ids) < chunk:
            break
    return purged


def purge_events(before: datetime) -> None:
    """The worker's metric events as old as the purged requests: one chunk, carried."""
    with transaction.atomic():
        ids = list(
            MetricEvent.objects.filter(at__lt=before).values_list("pk", flat=True)[:PURGE_CHUNK]
        )
        if ids:
            metric_totals.carry_purged_events(ids)
            MetricEvent.objects.filter(pk__in=ids).delete()


def purge_due(chunks: int) -> int:
    """The worker's share, now and then: up to `chunks` chunks by the setting, logged.
    Idempotency keys older than a day go too, whatever the setting."""
    from .api import idempotency  # the API's own table; the API imports much of the rest

    idempotency.purge()
    before = cutoff()
    if before is None:
        return 0
    purged = purge_finished(before, PURGE_CHUNK, chunks)
    purge_events(before)
    if purged:
        log.info(
            "purged %d requests that finished more than %g days ago"
            " (SWITCHYARD_KEEP_FINISHED_DAYS)",
            purged,
            keep_days(),
        )
    return purged

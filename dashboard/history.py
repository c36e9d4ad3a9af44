"""The worker's history task: once a second it follows each deployment's state into load
spans and stamps ETAs (`dashboard/eta_checks.py`); once a minute it rolls the minute just
ended up into `MinuteStat` rows; now and then it prunes what is older than `KEEP`.

Its cost is fixed (a few small reads a second), whatever the number of dashboards open.
Several workers may run it at once: each row it creates is unique by its key and created
with `ignore_conflicts`, and its updates write the same values whoever writes them."""

import asyncio
import contextlib
import logging
import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Expression,
    FloatField,
    Func,
    Max,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from access.usage import asked_tokens, completion_tokens
from backends.models import Deployment
from backends.models import DeploymentState as DS
from scheduler import faults
from scheduler.eta import token_line
from scheduler.models import TERMINAL_STATES, WAITING_STATES, Priority, Request, State
from scheduler.pool_threads import in_pool_thread

from .models import EtaCheck, LoadSpan, MinuteStat, RunStat

log = logging.getLogger(__name__)

TICK_S = 1.0
KEEP = timedelta(days=2)
PRUNE_EVERY = timedelta(hours=1)
BACKFILL = timedelta(hours=24)  # minutes missed while no worker ran, rolled up after
BACKFILL_STEP = 60  # minutes rolled up in one tick at most
MINUTE = timedelta(minutes=1)
RUN_WEIGHT = 0.3  # of each rolled-up minute's mean run time in the expected one
PRESENT = (DS.LOADING, DS.LOADED, DS.UNLOADING)


def floor_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank, as the simulation and the bench count it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


# -- load spans ------------------------------------------------------------------------------


def span_start(d: Deployment) -> datetime:
    """When this stay began: the load's start, unless that is an older load's (a model found
    loaded by a status sync keeps the last load's start)."""
    if d.state == DS.LOADING or d.loaded_at is None:
        return d.load_started_at or d.state_changed_at
    took = (d.loaded_at - d.load_started_at).total_seconds() if d.load_started_at else -1
    return d.load_started_at if 0 <= took <= d.model.load_timeout_s + 60 else d.loaded_at


def record_loads(now: datetime) -> None:
    """Open a span for each model that arrived on a server, mark when it was loaded, close
    it when it left (at the time its state changed)."""
    open_spans = {s.deployment_id: s for s in LoadSpan.objects.filter(ended_at__isnull=True)}
    new: list[LoadSpan] = []
    for d in Deployment.objects.select_related("server", "model"):
        span = open_spans.pop(d.pk, None)
        if d.state not in PRESENT:
            if span is not None:
                close(span, d.state_changed_at, failed=span.loaded_at is None)
            continue
        start = span_start(d)
        if span is not None and span.started_at != start:
            close(span, start, failed=span.loaded_at is None)  # it left and came back
            span = None
        loaded_at = d.loaded_at if d.state != DS.LOADING else None
        if span is None:
            new.append(
                LoadSpan(
                    deployment_id=d.pk,
                    server=d.server.name,
                    model=d.model.name,
                    started_at=start,
                    loaded_at=loaded_at,
                )
            )
        elif span.loaded_at is None and loaded_at is not None:
            LoadSpan.objects.filter(pk=span.pk).update(loaded_at=loaded_at)
    for span in open_spans.values():  # its deployment was deleted
        close(span, now, failed=span.loaded_at is None)
    LoadSpan.objects.bulk_create(new, ignore_conflicts=True)


def close(span: LoadSpan, at: datetime, failed: bool) -> None:
    LoadSpan.objects.filter(pk=span.pk).update(ended_at=max(at, span.started_at), failed=failed)


# -- minutes ---------------------------------------------------------------------------------


RunSamples = dict[tuple[int, int], list[tuple[float, int | None, int | None]]]
"""By model and class: each completed request's run time, the tokens it generated and the
tokens it asked for at most."""


class Seconds(Func):
    """`later - earlier` in seconds, as the database's own float: drivers read a float
    several times faster than a timestamp with its time zone, and a busy minute holds tens
    of thousands of finished requests (docs/performance.md, "The dashboard")."""

    arity = 2
    arg_joiner = " - "
    template = "CAST(EXTRACT(EPOCH FROM (%(expressions)s)) AS double precision)"
    output_field = FloatField()

    def __init__(self, later: Expression | str, earlier: Expression | datetime | str) -> None:
        if isinstance(earlier, datetime):
            earlier = Value(earlier, output_field=DateTimeField())
        super().__init__(later, earlier)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list]:
        # SQLite holds a timestamp as its text, `YYYY-MM-DD HH:MM:SS[.ffffff]`: whole seconds
        # and fractions subtracted apart keep the microseconds (julianday() keeps ms).
        (later, later_params), (earlier, earlier_params) = (
            compiler.compile(side) for side in self.get_source_expressions()
        )
        whole = "CAST(strftime('%%s', substr({0}, 1, 19)) AS INTEGER)"
        fraction = "CAST(substr({0}, 20) AS REAL)"
        sql = (
            f"(({whole.format(later)} - {whole.format(earlier)})"
            f" + ({fraction.format(later)} - {fraction.format(earlier)}))"
        )
        return sql, [*later_params, *earlier_params] * 2


def minute_rows(
    since: datetime, until: datetime, runs: RunSamples | None = None
) -> dict[tuple[datetime, int], list[float]]:
    """The waits of the requests that finished in [since, until), by minute and class
    (read through the index of finished requests); and into `runs`, if given, the run
    times of those completed, the tokens they generated and those they asked for at most,
    by model and class. It reads seconds, not timestamps: the database driver reads a
    float several times faster than a timestamp (`Seconds`)."""
    waits: dict[tuple[datetime, int], list[float]] = defaultdict(list)
    rows = Request.objects.filter(
        state__in=TERMINAL_STATES, finished_at__gte=since, finished_at__lt=until
    ).annotate(
        after=Seconds("finished_at", since),
        waited=Seconds(Coalesce("started_at", "finished_at"), "created_at"),
    )
    fields = ["priority", "after", "waited"]
    if runs is not None:
        ran = When(
            state=State.COMPLETED, model__isnull=False, then=Seconds("finished_at", "started_at")
        )
        rows = rows.annotate(ran=Case(ran), generated=completion_tokens(), asked=asked_tokens())
        fields += ["model_id", "ran", "generated", "asked"]
    last = floor_minute(until - timedelta(microseconds=1))
    for row in rows.order_by().values_list(*fields):
        priority, after, waited = row[:3]
        # Within the range its row was read from, whatever a float's last digits say.
        minute = min(floor_minute(since + timedelta(seconds=max(after, 0.0))), last)
        waits[(minute, priority)].append(max(waited, 0.0))
        if runs is not None and row[4] is not None:
            model_id, ran, generated, asked = row[3:]
            runs[(model_id, priority)].append((ran, generated, asked))
    return waits


def moved(old: float | None, new: float | None) -> float | None:
    """A moving average `old` moved RUN_WEIGHT of the way toward `new`."""
    if old is None or new is None:
        return new if old is None else old
    return old + RUN_WEIGHT * (new - old)


def natural_tokens(answers: list[tuple[int, int | None]]) -> float | None:
    """How long an answer runs when no cap cuts it, from (tokens generated, tokens asked
    for at most) of answers: all the tokens generated over the answers that ended by
    themselves (fewer than asked, or none asked), so that one cut at its cap counts as
    running at least that long (the mean of an exponential length, estimated from cut
    answers too): where most answers are cut, the mean of the few that ended early alone
    made answers look short. None while none ended by itself: a request runs as long as it
    asks."""
    ended = sum(1 for n, asked in answers if asked is None or n < asked)
    return sum(n for n, _ in answers) / ended if ended else None


def update_runs(runs: RunSamples, now: datetime) -> None:
    """Move each model and class's expected run time toward the mean of the minutes just
    rolled up, and, of the runs whose server counted their tokens, its token line
    (`eta.token_line`) and how long an answer runs uncut (`natural_tokens`): a few rows,
    one per model and class that ran."""
    known = {
        (r.model_id, r.priority): r
        for r in RunStat.objects.filter(model_id__in=[m for m, _ in runs])
    }
    for (model_id, priority), values in runs.items():
        mean = sum(ran for ran, _, _ in values) / len(values)
        base_s, token_s = token_line((ran, n) for ran, n, _ in values if n) or (None, None)
        natural = natural_tokens([(n, asked) for _, n, asked in values if n])
        stat = known.get((model_id, priority))
        if stat is None:
            stat = RunStat(
                model_id=model_id,
                priority=priority,
                run_s=mean,
                base_s=base_s,
                token_s=token_s,
                natural_tokens=natural,
                updated_at=now,
            )
            RunStat.objects.bulk_create([stat], ignore_conflicts=True)
        else:
            RunStat.objects.filter(pk=stat.pk).update(
                run_s=moved(stat.run_s, mean),
                base_s=moved(stat.base_s, base_s),
                token_s=moved(stat.token_s, token_s),
                natural_tokens=moved(stat.natural_tokens, natural),
                updated_at=now,
            )


def count_waiting() -> dict[int, int]:
    """How many wait in each class now (one read of the index of waiting requests)."""
    counts = dict.fromkeys(Priority.values, 0)
    rows = Request.objects.filter(state__in=WAITING_STATES).values("priority")
    for row in rows.annotate(n=Count("id")).order_by():
        counts[row["priority"]] = row["n"]
    return counts


def roll_up(now: datetime) -> int:
    """Write the minutes that ended since the last rolled up (at most BACKFILL back,
    BACKFILL_STEP at a time). The minute just ended also gets the line's length now."""
    this_minute = floor_minute(now)
    last = MinuteStat.objects.aggregate(last=Max("minute"))["last"]
    first = this_minute - MINUTE if last is None else max(last + MINUTE, this_minute - BACKFILL)
    until = min(this_minute, first + BACKFILL_STEP * MINUTE)
    if first >= until:
        return 0
    runs: RunSamples = defaultdict(list)
    waits = minute_rows(first, until, runs)
    update_runs(runs, now)
    waiting = count_waiting() if until == this_minute else {}
    stats = []
    minute = first
    while minute < until:
        for priority in Priority.values:
            values = waits.get((minute, priority), [])
            stats.append(
                MinuteStat(
                    minute=minute,
                    priority=priority,
                    finished=len(values),
                    wait_p50_s=percentile(values, 50),
                    wait_p95_s=percentile(values, 95),
                    waiting=waiting.get(priority) if minute == this_minute - MINUTE else None,
                )
            )
        minute += MINUTE
    MinuteStat.objects.bulk_create(stats, ignore_conflicts=True)
    return len(stats)


# -- the task --------------------------------------------------------------------------------


def prune(now: datetime) -> None:
    before = now - KEEP
    MinuteStat.objects.filter(minute__lt=before).delete()
    LoadSpan.objects.filter(ended_at__lt=before).delete()
    EtaCheck.objects.filter(given_at__lt=before).delete()


class Recorder:
    """One tick's work, and when the once-a-minute and once-an-hour parts are next due."""

    def __init__(self) -> None:
        self.next_minute: datetime | None = None
        self.next_prune: datetime | None = None

    def tick(self, now: datetime | None = None) -> None:
        from . import eta_checks  # noqa: PLC0415 (it imports the estimator, which imports us)

        now = now or timezone.now()
        record_loads(now)
        eta_checks.record(now)
        due = self.next_minute is None or now >= self.next_minute
        # A backfill goes on at the next tick until it has caught up.
        if due and roll_up(now) < BACKFILL_STEP * len(Priority.values):
            self.next_minute = floor_minute(now) + MINUTE
        if self.next_prune is None or now >= self.next_prune:
            prune(now)
            self.next_prune = now + PRUNE_EVERY


async def record_forever(stop: asyncio.Event, tick_s: float = TICK_S) -> None:
    """The worker's side task: a tick a second until `stop` (a failing tick is logged and
    the next one tries again: history must never stop the worker)."""
    recorder = Recorder()
    tick = in_pool_thread(recorder.tick)
    database_down = False
    while not stop.is_set():
        try:
            await tick()
            database_down = False
        except faults.DATABASE_FAULTS as error:  # said once per outage, without a traceback
            if not database_down:
                log.warning("could not record the dashboard's history: %r", error)
            database_down = True
        except Exception:
            log.exception("could not record the dashboard's history")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(tick_s):
                await stop.wait()

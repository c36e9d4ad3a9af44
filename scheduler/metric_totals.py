"""The counters and histograms of /metrics, counted from durable rows at scrape time.

Every web process answers a scrape from the same truth (the database), whichever worker
did the work, so N web processes and M workers, on one host or many, report one set of
numbers and a counter read through any of them never goes back. Requests count from their
rows; loads, evictions and breaker trips from `MetricEvent` rows the worker writes. When
retention purges rows, what they had added is first carried into `MetricCarry` in the same
transaction, so a purge never makes a counter go down."""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import models
from django.db.models import Count, F, Q, Sum

from .models import TERMINAL_STATES, MetricCarry, MetricEvent, Priority, Request, State

WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
PROCESSING_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
LOAD_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)
LOAD_OUTCOMES = {
    MetricEvent.Kind.LOAD: "loaded",
    MetricEvent.Kind.LOAD_FAILED: "failed",
    MetricEvent.Kind.LOAD_STOPPED: "stopped",
}
Labels = tuple[tuple[str, str], ...]


def summed(counts: list[int], more: list[int]) -> list[int]:
    """Bucket counts added up; an empty list counts as zeros."""
    return [a + b for a, b in zip(counts or [0] * len(more), more, strict=True)]


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    buckets: list[int] = field(default_factory=list)  # cumulative, one per bound
    count: int = 0
    total: float = 0.0

    def add(self, buckets: Iterable[int], count: int, total: float) -> None:
        self.buckets = summed(self.buckets, list(buckets))
        self.count += count
        self.total += total


@dataclass
class Totals:
    counters: dict[str, dict[Labels, float]] = field(default_factory=lambda: defaultdict(dict))
    histograms: dict[str, dict[Labels, Histogram]] = field(
        default_factory=lambda: defaultdict(dict)
    )

    def count(self, metric: str, labels: Labels, value: float) -> None:
        self.counters[metric][labels] = self.counters[metric].get(labels, 0) + value

    def observe(self, metric: str, labels: Labels, bounds, buckets, count, total) -> None:
        found = self.histograms[metric].setdefault(labels, Histogram(bounds))
        found.add(buckets, count, total)


def seconds(value: timedelta | float | None) -> float:
    if value is None:
        return 0.0
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _duration(start: str, end: str) -> models.ExpressionWrapper:
    return models.ExpressionWrapper(F(end) - F(start), output_field=models.DurationField())


def _histogram(name: str, bounds, where: Q) -> dict[str, models.Aggregate]:
    aggregates = {
        f"{name}_le_{i}": Count("pk", filter=where & Q(**{f"{name}__lte": timedelta(seconds=b)}))
        for i, b in enumerate(bounds)
    }
    aggregates[f"{name}_count"] = Count("pk", filter=where)
    aggregates[f"{name}_sum"] = Sum(name, filter=where)
    return aggregates


def count_requests(totals: Totals, rows: models.QuerySet) -> None:
    """Add what the requests in `rows` count for: outcomes, retries, waits, processing."""
    started = Q(started_at__isnull=False)
    served = started & Q(state__in=[State.COMPLETED, State.FAILED], finished_at__isnull=False)
    # Turns that continued a conversation, where its last turn ran or not (prompt-cache
    # affinity: docs/api.md).
    continued = Q(state=State.COMPLETED, cache_server__isnull=False)
    back = continued & Q(server=F("cache_server"))
    grouped = (
        rows.annotate(wait=_duration("created_at", "started_at"))
        .annotate(processing=_duration("started_at", "finished_at"))
        .values("priority", "model__name")
        .annotate(
            **{s: Count("pk", filter=Q(state=s)) for s in TERMINAL_STATES},
            retries=Sum(F("attempts") - 1, filter=Q(attempts__gt=1)),
            turns_back=Count("pk", filter=back),
            turns_moved=Count("pk", filter=continued & ~back),
            **_histogram("wait", WAIT_BUCKETS, started),
            **_histogram("processing", PROCESSING_BUCKETS, served),
        )
        .order_by()
    )
    for row in grouped:
        labels = (("class", Priority(row["priority"]).label), ("model", row["model__name"] or ""))
        for state in TERMINAL_STATES:
            if row[state]:
                totals.count("requests", (*labels, ("outcome", state)), row[state])
        if row["retries"]:
            totals.count("request_retries", labels, row["retries"])
        for ran_on, turns in (("last_server", "turns_back"), ("other_server", "turns_moved")):
            if row[turns]:
                totals.count("conversation_turns", (*labels, ("ran_on", ran_on)), row[turns])
        for name, bounds in (("wait", WAIT_BUCKETS), ("processing", PROCESSING_BUCKETS)):
            if row[f"{name}_count"]:
                buckets = [row[f"{name}_le_{i}"] for i in range(len(bounds))]
                total = seconds(row[f"{name}_sum"])
                totals.observe(name, labels, bounds, buckets, row[f"{name}_count"], total)


def count_events(totals: Totals, rows: models.QuerySet) -> None:
    """Add what the worker's events in `rows` count for: loads, restores, evictions, breaker
    trips."""
    loaded = Q(kind=MetricEvent.Kind.LOAD)
    grouped = (
        rows.values("kind", "server", "model")
        .annotate(
            n=Count("pk"),
            **{
                f"load_le_{i}": Count("pk", filter=loaded & Q(seconds__lte=b))
                for i, b in enumerate(LOAD_BUCKETS)
            },
            load_sum=Sum("seconds", filter=loaded),
        )
        .order_by()
    )
    for row in grouped:
        labels = (("server", row["server"]), ("model", row["model"]))
        kind = row["kind"]
        if outcome := LOAD_OUTCOMES.get(kind):
            totals.count("loads", (*labels, ("outcome", outcome)), row["n"])
        if kind == MetricEvent.Kind.LOAD:
            buckets = [row[f"load_le_{i}"] for i in range(len(LOAD_BUCKETS))]
            totals.observe("load", labels, LOAD_BUCKETS, buckets, row["n"], row["load_sum"] or 0)
        elif kind == MetricEvent.Kind.RESTORE:
            totals.count("restores", labels, row["n"])
        elif kind == MetricEvent.Kind.EVICTION:
            totals.count("evictions", labels, row["n"])
        elif kind == MetricEvent.Kind.BREAKER_TRIP:
            totals.count("breaker_trips", (("server", row["server"]),), row["n"])


def add_carried(totals: Totals) -> None:
    for carry in MetricCarry.objects.all():
        labels = tuple((k, v) for k, v in carry.labels)
        if carry.buckets:
            bounds = {"wait": WAIT_BUCKETS, "processing": PROCESSING_BUCKETS}.get(
                carry.metric, LOAD_BUCKETS
            )
            totals.observe(carry.metric, labels, bounds, carry.buckets, carry.count, carry.total)
        else:
            totals.count(carry.metric, labels, carry.total)


def current() -> Totals:
    """Every counter and histogram as of now: kept rows plus what purged ones carried."""
    totals = Totals()
    count_requests(totals, Request.objects.filter(state__in=TERMINAL_STATES))
    count_events(totals, MetricEvent.objects.all())
    add_carried(totals)
    return totals


def carry(totals: Totals) -> None:
    """Add `totals` (of rows about to be purged) to the carried ones. In the purge's
    transaction: the rows go and their counts stay, together or not at all."""
    rows = [
        (m, labels, None, value)
        for m, by in totals.counters.items()
        for labels, value in by.items()
    ]
    rows += [(m, labels, h, 0) for m, by in totals.histograms.items() for labels, h in by.items()]
    for metric, labels, histogram, value in rows:
        key = ",".join(f"{k}={v}" for k, v in labels)
        found, _ = MetricCarry.objects.select_for_update().get_or_create(
            metric=metric, key=key, defaults={"labels": [list(pair) for pair in labels]}
        )
        if histogram is None:
            found.total += value
        else:
            found.buckets = summed(found.buckets, histogram.buckets)
            found.count += histogram.count
            found.total += histogram.total
        found.save()


def carry_purged_requests(ids: list) -> None:
    totals = Totals()
    count_requests(totals, Request.objects.filter(pk__in=ids, state__in=TERMINAL_STATES))
    carry(totals)


def carry_purged_events(ids: list) -> None:
    totals = Totals()
    count_events(totals, MetricEvent.objects.filter(pk__in=ids))
    carry(totals)

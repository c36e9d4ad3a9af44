"""What the charts and the per-class summary read: per-minute figures by class from
`MinuteStat` (one row per class and minute, so 24 hours are 5,760 small rows however many
requests there were), the minute under way from the requests finished in it, and each
server's load spans. Cached a few seconds per process: every open dashboard asks."""

from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Aggregate, Count, FloatField, Min, Q
from django.db.models.functions import Coalesce

from backends.models import Server
from scheduler.durations import to_ms
from scheduler.models import TERMINAL_STATES, WAITING_STATES, Priority, Request, State

from . import eta_checks
from .history import MINUTE, Seconds, count_waiting, floor_minute, minute_rows, percentile
from .models import LoadSpan, MinuteStat

RANGES = {"1h": 60, "6h": 6 * 60, "24h": 24 * 60}
CACHE_S = 5
RECENT = timedelta(minutes=15)
CLASSES = {p.value: p.label for p in Priority}


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def cached(key: str, build, seconds: float = CACHE_S):
    found = cache.get(key)
    if found is None:
        found = build()
        cache.set(key, found, seconds)
    return found


def history(range_key: str, now: datetime) -> dict:
    minutes = RANGES[range_key]
    return cached(f"switchyard:history:{range_key}", lambda: _history(minutes, now))


def _history(minutes: int, now: datetime) -> dict:
    current = floor_minute(now)
    since = current - (minutes - 1) * MINUTE
    slots = [since + i * MINUTE for i in range(minutes)]
    index = {m: i for i, m in enumerate(slots)}
    series = {
        name: {label: [None] * minutes for label in CLASSES.values()}
        for name in ("finished", "wait_p50_s", "wait_p95_s", "waiting")
    }
    for s in MinuteStat.objects.filter(minute__gte=since, minute__lt=current):
        label = CLASSES.get(s.priority)
        if label is None or s.minute not in index:
            continue
        i = index[s.minute]
        series["finished"][label][i] = s.finished
        series["wait_p50_s"][label][i] = s.wait_p50_s
        series["wait_p95_s"][label][i] = s.wait_p95_s
        series["waiting"][label][i] = s.waiting
    # The minute under way, as it stands.
    waits = minute_rows(current, now + timedelta(seconds=1))
    waiting = count_waiting()
    for priority, label in CLASSES.items():
        values = waits.get((current, priority), [])
        series["finished"][label][-1] = len(values)
        series["wait_p50_s"][label][-1] = percentile(values, 50)
        series["wait_p95_s"][label][-1] = percentile(values, 95)
        series["waiting"][label][-1] = waiting.get(priority, 0)
    return {
        "at": iso(now),
        "since": iso(since),
        "minutes": [int(m.timestamp()) for m in slots],
        "classes": list(CLASSES.values()),
        **series,
        "timeline": timeline(since, now),
        "eta_accuracy": eta_accuracy(now),
        "p95_wait_15m_s": {
            CLASSES[p]: None if v is None else round(v, 1) for p, v in recent_p95(now).items()
        },
    }


SWAP_SLACK = timedelta(seconds=1)  # a load may start just before the stay it ends has ended


def timeline(since: datetime, now: datetime) -> list[dict]:
    """Each server's stays of models that overlap [since, now], oldest first. Stays at once
    (several models held) go on rows of their own: each stay takes the first row free by
    its start (`row`; the server's `rows`), so no bar hides another."""
    spans = LoadSpan.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since)).order_by(
        "started_at"
    )
    names = Server.objects.values_list("name", flat=True)
    rows: dict[str, list[dict]] = {name: [] for name in names}
    free_from: dict[str, list[datetime]] = {name: [] for name in names}  # per row
    for s in spans:
        end = s.ended_at or now
        ends = free_from.setdefault(s.server, [])
        row = next((i for i, free in enumerate(ends) if free <= s.started_at), len(ends))
        if row == len(ends):
            ends.append(end)
        ends[row] = end - SWAP_SLACK
        rows.setdefault(s.server, []).append(
            {
                "model": s.model,
                "started_at": iso(s.started_at),
                "loaded_at": iso(s.loaded_at),
                "ended_at": iso(s.ended_at),
                "failed": s.failed,
                "load_s": to_ms((s.loaded_at - s.started_at).total_seconds())
                if s.loaded_at
                else None,
                "stay_s": round((end - s.started_at).total_seconds(), 1),
                "row": row,
            }
        )
    return [
        {"server": name, "rows": max(len(free_from.get(name, [])), 1), "spans": spans}
        for name, spans in sorted(rows.items())
    ]


class NearestRank(Aggregate):
    """PostgreSQL's PERCENTILE_DISC: the nearest-rank percentile, as `percentile()`."""

    function = "PERCENTILE_DISC"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


def recent_p95(now: datetime) -> dict[int, float | None]:
    """Per class, the 95th percentile wait of the requests that finished in the last 15
    minutes (through the index of finished requests; cached). PostgreSQL ranks them itself:
    of 30,000 rows, 59 ms, against 104 ms for their waits read into Python."""

    def build() -> dict[int, float | None]:
        rows = Request.objects.filter(state__in=TERMINAL_STATES, finished_at__gte=now - RECENT)
        found: dict[int, float | None] = dict.fromkeys(CLASSES)
        waited = Seconds(Coalesce("started_at", "finished_at"), "created_at")
        if settings.IS_POSTGRES:
            ranked = rows.values("priority").annotate(p95=NearestRank(waited, fraction=0.95))
            found |= {r["priority"]: r["p95"] for r in ranked.order_by()}
            return found
        waits: dict[int, list[float]] = {p: [] for p in CLASSES}
        for priority, seconds in rows.annotate(w=waited).order_by().values_list("priority", "w"):
            waits.setdefault(priority, []).append(max(seconds, 0.0))
        return found | {p: percentile(v, 95) for p, v in waits.items()}

    return cached("switchyard:recent-p95", build, 10)


def class_summary(now: datetime) -> list[dict]:
    """Per class: how many wait and run, the oldest wait, and the class's limits (max wait,
    max line; 0 is no limit of its own). Two small reads whatever the depth; the p95 wait of
    the last 15 minutes reads those minutes' requests, so it comes with the history."""
    waiting = {
        row["priority"]: row
        for row in Request.objects.filter(state__in=WAITING_STATES)
        .values("priority")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by()
    }
    running = dict(
        Request.objects.filter(state=State.PROCESSING)
        .values_list("priority")
        .annotate(n=Count("id"))
        .order_by()
    )
    knobs = settings.SWITCHYARD
    rows = []
    for priority, label in CLASSES.items():
        w = waiting.get(priority)
        rows.append(
            {
                "class": label,
                "waiting": w["n"] if w else 0,
                "processing": running.get(priority, 0),
                "oldest_wait_s": round((now - w["oldest"]).total_seconds(), 1) if w else None,
                "max_wait_s": knobs.get(f"MAX_WAIT_{label.upper()}_S"),
                "max_queue": knobs.get(f"MAX_QUEUE_{label.upper()}"),
            }
        )
    return rows


def eta_accuracy(now: datetime) -> dict:
    a = eta_checks.accuracy(now)
    return {
        "checked": a.checked,
        "share_within": None if a.share is None else round(a.share, 3),
        "median_error_s": None if a.median_error_s is None else round(a.median_error_s, 1),
    }

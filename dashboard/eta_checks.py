"""The ETA measured live. Each tick of the history task gives every request in the head of
the line that has none its first ETA (with its place), records a new ETA for those shown
on the dashboard whose place changed or whose forecast moved away from the last one
counted down (a load slower than its estimate), and, for the requests sent since, the
error of the first ETA. `accuracy()` is what the dashboard and /metrics show; `left_s()`
what a waiting stream says."""

from datetime import datetime, timedelta

from django.core.cache import cache

from scheduler.eta_accuracy import FLOOR_S, TOLERANCE, Accuracy
from scheduler.models import TERMINAL_STATES, Request, State

from . import forecast
from .models import EtaCheck

FOLLOWED = 100  # the places whose changes are recorded: those the dashboard lists
LOOKBACK = timedelta(seconds=10)  # requests that ended this recently may have started unseen
WINDOW = timedelta(hours=1)
CACHE_S = 10


def moved_off(last_s: float, eta: float) -> bool:
    """Has a new forecast moved away from the last one, counted down, by more than the
    ETA's own tolerance (a second, or a fifth)?"""
    return abs(eta - last_s) > max(FLOOR_S, TOLERANCE * max(eta, last_s))


def counted_down(last_at: datetime, last_s: float, now: datetime) -> float:
    return max(last_s - (now - last_at).total_seconds(), 0.0)


def record(now: datetime) -> None:
    line = forecast.head(now)
    ids = [r.pk for r in line.requests]
    known = {
        pk: (position, counted_down(last_at, last_s, now))
        for pk, position, last_at, last_s in EtaCheck.objects.filter(
            request_id__in=ids
        ).values_list("request_id", "last_position", "last_at", "last_s")
    }
    new, moved = [], []
    for position, r in enumerate(line.requests, start=1):
        eta = line.etas.get(r.pk)
        if eta is None:
            continue
        if r.pk not in known:
            new.append(
                EtaCheck(
                    request_id=r.pk,
                    priority=r.priority,
                    given_at=now,
                    given_s=eta,
                    position=position,
                    last_at=now,
                    last_s=eta,
                    last_position=position,
                )
            )
        elif position <= FOLLOWED and (
            known[r.pk][0] != position or moved_off(known[r.pk][1], eta)
        ):
            moved.append(EtaCheck(request_id=r.pk, last_at=now, last_s=eta, last_position=position))
    EtaCheck.objects.bulk_create(new, ignore_conflicts=True)
    EtaCheck.objects.bulk_update(moved, ["last_at", "last_s", "last_position"])
    record_starts(now)


def record_starts(now: datetime) -> int:
    """The error of the first ETA of each request sent since the last look: those running
    now, and those that ended a moment ago (read by the state and finished indexes)."""
    running = Request.objects.filter(state=State.PROCESSING)
    ended = Request.objects.filter(state__in=TERMINAL_STATES, finished_at__gte=now - LOOKBACK)
    started = {
        pk: at
        for rows in (running, ended)
        for pk, at in rows.filter(started_at__isnull=False).values_list("id", "started_at")
    }
    if not started:
        return 0
    open_checks = EtaCheck.objects.filter(request_id__in=started, started_at__isnull=True)
    checked = []
    for check in open_checks.only("request_id", "given_at", "given_s"):
        at = started[check.request_id]
        check.started_at = at
        check.error_s = (at - check.given_at).total_seconds() - check.given_s
        checked.append(check)
    EtaCheck.objects.bulk_update(checked, ["started_at", "error_s"])
    return len(checked)


def accuracy(now: datetime, window: timedelta = WINDOW) -> Accuracy:
    """Of the requests sent in the last `window`: the first ETA's error (cached a few
    seconds per process: every open dashboard and every scrape asks)."""
    key = f"switchyard:eta-accuracy:{int(window.total_seconds())}"
    found = cache.get(key)
    if found is not None:
        return found
    result = Accuracy()
    errors = EtaCheck.objects.filter(started_at__gte=now - window, error_s__isnull=False)
    for given_s, error_s in errors.values_list("given_s", "error_s"):
        result.add(given_s, given_s + error_s)
    cache.set(key, result, CACHE_S)
    return result


def accuracy_of(request_ids: list, using: str = "default") -> Accuracy:
    """The first ETA's error for these requests, those of them checked (for the bench)."""
    result = Accuracy()
    rows = EtaCheck.objects.using(using).filter(request_id__in=request_ids, error_s__isnull=False)
    for given_s, error_s in rows.values_list("given_s", "error_s"):
        result.add(given_s, given_s + error_s)
    return result


def left_s(request_id, now: datetime) -> float | None:
    """Seconds until a waiting request is sent, as this task last forecast them for it,
    counted down since (one read by key, for what is said on every waiting stream); None
    before a forecast reached it."""
    found = EtaCheck.objects.filter(request_id=request_id).values_list("last_at", "last_s").first()
    if found is None:
        return None
    return counted_down(*found, now)

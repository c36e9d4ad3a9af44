"""A key's limits at the door: its models, its class, its pace and its line.

Checked inside the transaction that stores the request, after locking the key's row, so two
web processes cannot both let through the request that crosses a limit. A refused request
stores nothing. What is left of the key's requests a minute and daily tokens is told in
OpenAI's `x-ratelimit-*` headers, which clients and gateways read to slow down."""

import math
from datetime import timedelta

from django.db.models import Count, Min, Q
from django.utils import timezone

from scheduler.api.errors import ApiError
from scheduler.models import WAITING_STATES, Priority, Request

from . import usage
from .models import ApiKey, Team

RATE_WINDOW_S = 60
WAITING_RETRY_S = 5  # a guess: a line moves by then, and the caller can ask again


def check_model(api_key: ApiKey | None, name: str, aliases_of) -> None:
    """403 unless the key may use the model called `name` (or an alias of one it may use).
    `aliases_of(name)` gives the model's names if it exists: read only when `name` is not
    itself on the key's list. A model that does not exist answers the same as one not
    allowed: a key learns nothing of models it may not use."""
    if api_key is None or api_key.allows_model(name):
        return
    if not any(api_key.allows_model(n) for n in aliases_of(name)):
        raise ApiError(
            403,
            f"This API key may not use the model `{name}`.",
            param="model",
            code="model_not_allowed",
        )


def capped_priority(api_key: ApiKey | None, asked: int | None, default: int) -> tuple[int, str]:
    """The class a request runs at, and a note for its trace if the key's cap lowered it."""
    if api_key is None:
        return (default if asked is None else asked), ""
    level = api_key.default_priority if asked is None else asked
    if level < api_key.max_priority:
        asked_name, cap = Priority(level).label, Priority(api_key.max_priority).label
        return api_key.max_priority, (
            f"asked for {asked_name}; runs at {cap}, the highest class its API key"
            f" ({api_key.name}) may use"
        )
    return level, ""


def admit(api_key: ApiKey | None) -> dict[str, str]:
    """429 if the key or its team used a daily quota, or the key sent `rpm` requests in the
    last minute or has `max_waiting` waiting. Call inside the transaction that stores the
    request. Returns the `x-ratelimit-*` headers its answer carries (none without an `rpm`
    or a daily token quota)."""
    if api_key is None:
        return {}
    paced = api_key.rpm is not None or api_key.max_waiting is not None
    if paced:  # serializes this key's arrivals (on PostgreSQL; SQLite's writers are serial)
        list(ApiKey.objects.select_for_update().filter(pk=api_key.pk).values_list("pk"))
    now = timezone.now()
    headers = check_daily_quotas(api_key, now)
    if paced:
        headers |= check_pace(api_key, now)
    return headers


def check_daily_quotas(api_key: ApiKey, now) -> dict[str, str]:
    """The key's daily quotas, then its team's; the tokens headers of the one with the fewest
    tokens left."""
    tokens = [check_daily_quota(api_key, now)]
    if api_key.team_id is not None:
        tokens.append(check_daily_quota(api_key.team, now))
    quotas = [quota for quota in tokens if quota is not None]
    if not quotas:
        return {}
    most, left = min(quotas, key=lambda quota: quota[1])
    return rate_headers("tokens", most, left, until_midnight(now))


def check_daily_quota(holder: ApiKey | Team, now) -> tuple[int, int] | None:
    """429 `insufficient_quota` once the requests that ended today (UTC) used the daily
    processing seconds or tokens of the key (or of all its team's keys). It is checked at
    the door: a request let in is served even if the ones before it use the quota up
    meanwhile (its use counts when it ends). Returns its daily tokens and those left, if it
    has a token quota."""
    if not holder.has_daily_quota():
        return None
    used = usage.today(now, **usage.of(holder))
    who = f"The team {holder.name}" if isinstance(holder, Team) else "This API key"
    tokens = usage.tokens(used)
    most_s, most_tokens = holder.daily_processing_s, holder.daily_tokens
    if most_s is not None and used["processing_s"] >= most_s:
        spent = f"{used['processing_s']:.0f} s of processing, its quota of {most_s} s a day"
    elif most_tokens is not None and tokens >= most_tokens:
        spent = f"{tokens} tokens, its quota of {most_tokens} a day"
    else:
        return None if most_tokens is None else (most_tokens, usage.left(holder, used)["tokens"])
    retry = until_midnight(now)
    hours, minutes = divmod(math.ceil(retry / 60), 60)
    raise ApiError(
        429,
        f"{who} has used {spent} (UTC days). It renews at 00:00 UTC, in {hours} h {minutes} min.",
        type="insufficient_quota",
        code="insufficient_quota",
        retry_after_s=retry,
        should_retry=False,
        headers=rate_headers("tokens", most_tokens, 0, retry) if most_tokens is not None else {},
    )


def until_midnight(now) -> int:
    """Whole seconds (at least 1) until the daily quotas renew, at 00:00 UTC."""
    _, renews = usage.midnights(now)
    return max(1, math.ceil((renews - now).total_seconds()))


def check_pace(api_key: ApiKey, now) -> dict[str, str]:
    """429 if the key sent `rpm` requests in the last minute or has `max_waiting` waiting.
    Returns the requests headers, counting the request being let in."""
    window_start = now - timedelta(seconds=RATE_WINDOW_S)
    mine = Request.objects.filter(api_key=api_key.pk, in_batch=False)  # a batch is one call
    recent = Q(created_at__gte=window_start)
    counts = mine.filter(recent | Q(state__in=WAITING_STATES)).aggregate(
        recent=Count("pk", filter=recent),
        waiting=Count("pk", filter=Q(state__in=WAITING_STATES)),
        oldest=Min("created_at", filter=recent),
    )
    if api_key.rpm is not None and counts["recent"] >= api_key.rpm:
        # The minute frees a place when the oldest request that counts in it leaves it.
        oldest = (
            mine.filter(created_at__gte=window_start)
            .order_by("-created_at")
            .values_list("created_at", flat=True)[max(api_key.rpm, 1) - 1 : max(api_key.rpm, 1)]
        )
        first = next(iter(oldest), now)
        retry = max(1, math.ceil(RATE_WINDOW_S - (now - first).total_seconds()))
        raise ApiError(
            429,
            f"This API key may send {api_key.rpm} requests a minute; try again in {retry} s.",
            code="rate_limited",
            retry_after_s=retry,
            headers=rate_headers("requests", api_key.rpm, 0, retry),
        )
    if api_key.max_waiting is not None and counts["waiting"] >= api_key.max_waiting:
        raise ApiError(
            429,
            f"This API key already has {counts['waiting']} requests waiting, its most"
            f" (max_waiting {api_key.max_waiting}); send more as they are served.",
            code="too_many_waiting",
            retry_after_s=WAITING_RETRY_S,
        )
    if api_key.rpm is None:
        return {}
    # A place in the minute frees when the oldest request in it (this one, if none) leaves.
    oldest = counts["oldest"] or now
    frees = RATE_WINDOW_S - (now - oldest).total_seconds()
    return rate_headers("requests", api_key.rpm, api_key.rpm - counts["recent"] - 1, frees)


def rate_headers(unit: str, limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    """OpenAI's headers for one limit: `unit` is `requests` (a minute) or `tokens` (a day);
    the reset is when the remaining count next goes up."""
    return {
        f"x-ratelimit-limit-{unit}": str(limit),
        f"x-ratelimit-remaining-{unit}": str(max(0, remaining)),
        f"x-ratelimit-reset-{unit}": duration(reset_s),
    }


def duration(seconds: float) -> str:
    """A time as OpenAI's reset headers write it: `250ms`, `45s`, `6m0s`, `13h2m5s`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"

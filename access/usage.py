"""What each API key used, by day (UTC): requests ended, prompt and completion tokens (the
servers' `usage`; a Responses API answer's input and output tokens; an Anthropic message's
too, with the prompt tokens it read from or wrote to the server's prompt cache), processing
seconds.

Counted from the requests themselves, so the hot path writes nothing more: the finished
requests still kept are summed when asked, and a request's usage moves into `KeyUsage` in
the transaction that purges it (retention), so a day's figures outlive its requests."""

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from datetime import UTC, date, datetime, timedelta

from django.db.models import BigIntegerField, Count, DurationField, ExpressionWrapper, F, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, TruncDate

from scheduler.models import TERMINAL_STATES, Request

from .models import ApiKey, KeyUsage, Team

FIELDS = ("requests", "prompt_tokens", "completion_tokens", "processing_s")
Usage = dict[tuple[int, date], dict[str, float]]


def _count(name: str) -> Cast:
    return Cast(KT(f"result__usage__{name}"), BigIntegerField())


def completion_tokens() -> Coalesce:
    """As a chat completion names them, or a Responses API response and a message do."""
    return Coalesce(_count("completion_tokens"), _count("output_tokens"))


# The names a request gives the most tokens its answer may have: the chat API's, its newer
# one, the Responses API's (Ollama's `num_predict` and a message's arrive as `max_tokens`).
TOKEN_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def asked_tokens() -> Coalesce:
    """The most tokens a request let its answer have, where it said."""
    return Coalesce(*(Cast(KT(f"payload__{name}"), BigIntegerField()) for name in TOKEN_CAPS))


def _prompt_tokens() -> Coalesce:
    """As a chat completion names them, or a Responses API response and a message do. A
    message's `input_tokens` leave out those read from or written to the prompt cache,
    counted beside them (Claude Code's prompt on llama-server: 1 input token, 15,740 read
    from the cache); a chat's `prompt_tokens` and a response's `input_tokens` hold them, so
    they are added back: a prompt counts the same whichever API asked it."""
    cached = Coalesce(_count("cache_read_input_tokens"), 0) + Coalesce(
        _count("cache_creation_input_tokens"), 0
    )
    return Coalesce(_count("prompt_tokens"), _count("input_tokens") + cached)


def _sums(requests) -> Usage:
    rows = (
        requests.filter(state__in=TERMINAL_STATES, api_key__isnull=False)
        .annotate(day=TruncDate("finished_at"))
        .values("api_key", "day")
        .annotate(
            requests=Count("id"),
            prompt_tokens=Sum(_prompt_tokens(), default=0),
            completion_tokens=Sum(completion_tokens(), default=0),
            processing=Sum(
                ExpressionWrapper(
                    F("finished_at") - Coalesce("started_at", "finished_at"),
                    output_field=DurationField(),
                )
            ),
        )
    )
    found: Usage = {}
    for row in rows:
        found[row["api_key"], row["day"]] = {
            "requests": row["requests"],
            "prompt_tokens": row["prompt_tokens"] or 0,
            "completion_tokens": row["completion_tokens"] or 0,
            "processing_s": row["processing"].total_seconds() if row["processing"] else 0.0,
        }
    return found


def usage(
    api_key_id: int | None = None, since: datetime | None = None, team_id: int | None = None
) -> Usage:
    """(key id, day) -> figures, of one key, the keys of one team or all, of the days from
    `since`'s on."""
    requests, stored = Request.objects.all(), KeyUsage.objects.all()
    if api_key_id is not None:
        requests, stored = requests.filter(api_key=api_key_id), stored.filter(api_key=api_key_id)
    if team_id is not None:
        requests = requests.filter(api_key__team=team_id)
        stored = stored.filter(api_key__team=team_id)
    if since is not None:
        requests = requests.filter(finished_at__gte=since)
        stored = stored.filter(day__gte=since.date())
    total: Usage = defaultdict(lambda: dict.fromkeys(FIELDS, 0))
    for row in stored.values("api_key", "day", *FIELDS):
        for name in FIELDS:
            total[row["api_key"], row["day"]][name] += row[name]
    for at, figures in _sums(requests).items():
        for name in FIELDS:
            total[at][name] += figures[name]
    return dict(total)


def tokens(figures: dict[str, float]) -> int:
    """The tokens a daily quota counts: prompt and completion."""
    return int(figures["prompt_tokens"] + figures["completion_tokens"])


def left(holder: ApiKey | Team, used: dict[str, float]) -> dict[str, float | int | None]:
    """What the holder's daily quotas leave today (never below 0); None where it has none."""
    most_s, most_tokens = holder.daily_processing_s, holder.daily_tokens
    return {
        "processing_s": None if most_s is None else max(0.0, most_s - used["processing_s"]),
        "tokens": None if most_tokens is None else max(0, most_tokens - tokens(used)),
    }


def midnights(now: datetime) -> tuple[datetime, datetime]:
    """The UTC midnights that begin and end `now`'s day (an aware UTC time)."""
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def of(holder: ApiKey | Team) -> dict[str, int]:
    """The arguments of `usage` and `today` that select a key's requests, or those of all a
    team's keys."""
    return {"team_id": holder.pk} if isinstance(holder, Team) else {"api_key_id": holder.pk}


def summed(found: Usage, group: Callable[[int, date], Hashable | None]) -> dict:
    """`found` added up by `group(key id, day)`; a key it groups as None is left out."""
    totals: dict = {}
    for (key_id, day), figures in found.items():
        if (into := group(key_id, day)) is None:
            continue
        total = totals.setdefault(into, dict.fromkeys(FIELDS, 0))
        for name in FIELDS:
            total[name] += figures[name]
    return totals


def by_day(found: Usage) -> dict[date, dict[str, float]]:
    """`found` summed over its keys, by day."""
    return summed(found, lambda _, day: day)


def today(
    now: datetime, api_key_id: int | None = None, team_id: int | None = None
) -> dict[str, float]:
    """What one key's requests (or those of all one team's keys) that ended today (UTC)
    used."""
    start, _ = midnights(now)
    found = by_day(usage(api_key_id, since=start, team_id=team_id))
    return found.get(start.date(), dict.fromkeys(FIELDS, 0))


def today_by(now: datetime, teams: bool = False) -> dict[int, dict[str, float]]:
    """Today's usage (UTC) of every key by its id, or with `teams` of every team (all its
    keys) by the team's id, in one read: for the lists that show many at once."""
    start, _ = midnights(now)
    found = usage(since=start)
    if not teams:
        return summed(found, lambda key_id, day: key_id if day == start.date() else None)
    team_of = dict(ApiKey.objects.filter(team__isnull=False).values_list("pk", "team"))
    return summed(found, lambda key_id, day: team_of.get(key_id) if day == start.date() else None)


def fold(request_ids: Iterable) -> None:
    """Add the usage of these requests (about to be purged) to `KeyUsage`. Call in the
    transaction that deletes them."""
    for (key_id, day), figures in _sums(Request.objects.filter(id__in=list(request_ids))).items():
        row, _ = KeyUsage.objects.select_for_update().get_or_create(api_key_id=key_id, day=day)
        for name in FIELDS:
            setattr(row, name, getattr(row, name) + figures[name])
        row.save()


GROUPS = ("key", "team", "day")


def report(
    since: date,
    until: date,
    by: Iterable[str] = ("key",),
    api_key_id: int | None = None,
    team_id: int | None = None,
) -> list[dict]:
    """The usage of the UTC days from `since` to `until` (both included), added up by key,
    team and/or day as `by` names them, in that order: a row per group with its figures
    (and `key`, `key_name`, `team`, `day` as grouped). For a report or a bill."""
    by = tuple(name for name in GROUPS if name in set(by))
    start = datetime.combine(since, datetime.min.time(), tzinfo=UTC)
    keys = {
        k.pk: k for k in ApiKey.objects.select_related("team").only("prefix", "name", "team__name")
    }

    def group(key_id: int, day: date) -> tuple | None:
        if not since <= day <= until:
            return None
        key = keys[key_id]
        named = {"key": key.prefix, "team": key.team.name if key.team else None, "day": day}
        return tuple(named[name] for name in by)

    totals = summed(usage(api_key_id, since=start, team_id=team_id), group)
    names = {k.prefix: k.name for k in keys.values()}

    def order(grouped: tuple) -> tuple:
        """Keys by name, teams by name with no team last, days in order."""
        return tuple(
            (v is None, names[v] if name == "key" else v or "", v or "")
            for name, v in zip(by, grouped, strict=True)
        )

    rows = []
    for grouped in sorted(totals, key=order):
        row: dict = dict(zip(by, grouped, strict=True))
        if "key" in row:
            row = {"key": row["key"], "key_name": names[row["key"]], **row}
        rows.append(row | totals[grouped])
    return rows

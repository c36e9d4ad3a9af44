"""Each API key's usage of today (UTC) in /metrics, and the share of its daily quotas (and
its team's) used, read at scrape time."""

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from . import usage
from .models import ApiKey, Team

FAMILIES = {
    "requests": ("switchyard_key_requests_today", "Requests ended today (UTC), by API key"),
    "prompt_tokens": ("switchyard_key_prompt_tokens_today", "Prompt tokens today, by API key"),
    "completion_tokens": (
        "switchyard_key_completion_tokens_today",
        "Completion tokens today, by API key",
    ),
    "processing_s": (
        "switchyard_key_processing_seconds_today",
        "Seconds of processing today, by API key",
    ),
}


class KeyUsageCollector:
    def collect(self):
        since, _ = usage.midnights(timezone.now())
        today = since.date()
        keys = {k.pk: k for k in ApiKey.objects.all()}
        families = {
            field: GaugeMetricFamily(name, text, labels=["key", "key_id"])
            for field, (name, text) in FAMILIES.items()
        }
        quota = GaugeMetricFamily(
            "switchyard_key_quota_used_ratio",
            "Share of its daily quota each API key used today (UTC): 1 and above, refused",
            labels=["key", "key_id", "quota"],
        )
        team_quota = GaugeMetricFamily(
            "switchyard_team_quota_used_ratio",
            "Share of its daily quota all the API keys of each team used today (UTC): 1 and"
            " above, refused",
            labels=["team", "team_id", "quota"],
        )
        found = usage.usage(since=since)
        used = usage.summed(found, lambda key_id, day: key_id if day == today else None)
        by_team = usage.summed(
            found,
            lambda key_id, day: keys[key_id].team_id if day == today and key_id in keys else None,
        )
        for key_id, figures in sorted(used.items()):
            labels = [keys[key_id].name if key_id in keys else "?", str(key_id)]
            for field, family in families.items():
                family.add_metric(labels, figures[field])
        for key in keys.values():
            add_shares(quota, [key.name, str(key.pk)], key, used.get(key.pk))
        for team in Team.objects.all():
            add_shares(team_quota, [team.name, str(team.pk)], team, by_team.get(team.pk))
        yield from families.values()
        yield quota
        yield team_quota


def add_shares(
    family: GaugeMetricFamily,
    labels: list[str],
    holder: ApiKey | Team,
    figures: dict[str, float] | None,
) -> None:
    """The share of each daily quota `holder` has that its `figures` of today used."""
    figures = figures or dict.fromkeys(usage.FIELDS, 0)
    tokens = usage.tokens(figures)
    for name, most, spent in (
        ("processing_seconds", holder.daily_processing_s, figures["processing_s"]),
        ("tokens", holder.daily_tokens, tokens),
    ):
        if most is not None:
            share = spent / most if most else 1.0  # a quota of 0 refuses all
            family.add_metric([*labels, name], share)

"""Each API key's usage of today (UTC) in /metrics, read at scrape time."""

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from . import usage
from .models import ApiKey

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
        used = {k: f for (k, day), f in usage.usage(since=since).items() if day == today}
        for key_id, figures in sorted(used.items()):
            labels = [keys[key_id].name if key_id in keys else "?", str(key_id)]
            for field, family in families.items():
                family.add_metric(labels, figures[field])
        for key in keys.values():
            figures = used.get(key.pk, dict.fromkeys(usage.FIELDS, 0))
            tokens = figures["prompt_tokens"] + figures["completion_tokens"]
            for name, most, spent in (
                ("processing_seconds", key.daily_processing_s, figures["processing_s"]),
                ("tokens", key.daily_tokens, tokens),
            ):
                if most is not None:
                    share = spent / most if most else 1.0  # a quota of 0 refuses all
                    quota.add_metric([key.name, str(key.pk), name], share)
        yield from families.values()
        yield quota

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
        names = dict(ApiKey.objects.values_list("id", "name"))
        families = {
            field: GaugeMetricFamily(name, text, labels=["key", "key_id"])
            for field, (name, text) in FAMILIES.items()
        }
        for (key_id, day), figures in sorted(usage.usage(since=since).items()):
            if day != today:
                continue
            labels = [names.get(key_id, "?"), str(key_id)]
            for field, family in families.items():
                family.add_metric(labels, figures[field])
        yield from families.values()

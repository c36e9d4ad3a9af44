"""The ETA's measured accuracy for /metrics: a collector the metrics view registers beside
its own (read from the ETA checks at scrape time, cached a few seconds per process)."""

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from . import eta_checks


class EtaCollector:
    def collect(self):
        a = eta_checks.accuracy(timezone.now())
        yield GaugeMetricFamily(
            "switchyard_eta_checked",
            "Requests sent in the last hour whose first ETA was checked",
            value=a.checked,
        )
        if a.share is not None:
            yield GaugeMetricFamily(
                "switchyard_eta_within_ratio",
                "Share of the requests sent in the last hour within ±20% (or 1 s) of the"
                " ETA they were first given",
                value=a.share,
            )
            yield GaugeMetricFamily(
                "switchyard_eta_median_error_seconds",
                "Median of |sent - first ETA| over the requests sent in the last hour",
                value=a.median_error_s,
            )

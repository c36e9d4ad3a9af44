"""Prometheus metrics at /metrics, for a staff login or `SWITCHYARD_METRICS_TOKEN` (as a
bearer token).

Everything is read from the database at scrape time, so every web process reports the same
truth, whichever worker did the work: gauges from the live rows, counters and histograms
from durable rows (see scheduler.metric_totals). No process keeps a number of its own."""

import hmac

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from access.metrics import KeyUsageCollector
from backends.models import Deployment, DeploymentState, Server
from dashboard.metrics import EtaCollector

from . import metric_totals
from .api.errors import ApiError
from .models import WAITING_STATES, Priority, Request, State, Worker

CLASSES = [p.label for p in Priority]
COUNTERS = {
    "requests": "Finished requests by class, model and outcome (the terminal state)",
    "request_retries": "Attempts of requests beyond their first, by class and model",
    "conversation_turns": "Completed turns that continued a conversation, by class, model and"
    " whether they ran on the server of its last turn (prompt-cache affinity)",
    "loads": "Model loads by server, model and outcome (loaded, failed or stopped)",
    "restores": "Loads started by restore on idle (nobody asked for them), by server and model",
    "evictions": "Models unloaded to make room for another, by server and model",
    "breaker_trips": "Times a server's breaker opened (cooldown after failures)",
}
HISTOGRAMS = {
    "wait": ("request_wait_seconds", "Time from arrival to being sent, by class and model"),
    "processing": ("request_processing_seconds", "Time at the server, by class and model"),
    "load": ("load_duration_seconds", "Time a successful load took, by server and model"),
}


class DatabaseCollector:
    def collect(self):
        yield from self.gauges()
        totals = metric_totals.current()
        for name, doc in COUNTERS.items():
            found = totals.counters.get(name, {})
            labels = [k for k, _ in next(iter(found), ())]
            family = CounterMetricFamily(f"switchyard_{name}", doc, labels=labels)
            for key, value in sorted(found.items()):
                family.add_metric([v for _, v in key], value)
            yield family
        for name, (metric, doc) in HISTOGRAMS.items():
            found = totals.histograms.get(name, {})
            labels = [k for k, _ in next(iter(found), ())]
            family = HistogramMetricFamily(f"switchyard_{metric}", doc, labels=labels)
            for key, h in sorted(found.items()):
                buckets = [(f"{b:g}", n) for b, n in zip(h.bounds, h.buckets, strict=True)]
                family.add_metric([v for _, v in key], [*buckets, ("+Inf", h.count)], h.total)
            yield family

    def gauges(self):
        now = timezone.now()
        waiting = GaugeMetricFamily(
            "switchyard_requests_waiting", "Requests waiting, by class", labels=["class"]
        )
        oldest = GaugeMetricFamily(
            "switchyard_oldest_waiting_seconds",
            "Age of the oldest waiting request, by class (0 when none waits)",
            labels=["class"],
        )
        rows = {
            r["priority"]: r
            for r in Request.objects.filter(state__in=WAITING_STATES)
            .values("priority")
            .annotate(n=Count("pk"), oldest=Min("created_at"))
            .order_by()
        }
        for p in Priority:
            row = rows.get(p.value)
            waiting.add_metric([p.label], row["n"] if row else 0)
            age = (now - row["oldest"]).total_seconds() if row else 0.0
            oldest.add_metric([p.label], max(age, 0.0))
        yield waiting
        yield oldest

        processing = GaugeMetricFamily(
            "switchyard_requests_processing", "Requests at a server, by server", labels=["server"]
        )
        busy = dict(
            Request.objects.filter(state=State.PROCESSING)
            .values_list("server__name")
            .annotate(n=Count("pk"))
            .order_by()
        )
        servers = list(Server.objects.all())
        for s in servers:
            processing.add_metric([s.name], busy.get(s.name, 0))
        yield processing

        up = GaugeMetricFamily(
            "switchyard_server_up", "1 if the server is enabled and healthy", labels=["server"]
        )
        for s in servers:
            up.add_metric([s.name], 1.0 if s.enabled and s.health == "up" else 0.0)
        yield up

        loaded = GaugeMetricFamily(
            "switchyard_models_loaded", "Models loaded, by server", labels=["server"]
        )
        states = GaugeMetricFamily(
            "switchyard_deployments", "Deployments by server and state", labels=["server", "state"]
        )
        in_flight = GaugeMetricFamily(
            "switchyard_in_flight", "Requests being served", labels=["server", "model"]
        )
        counts: dict[tuple[str, str], int] = {}
        for d in Deployment.objects.select_related("server", "model"):
            counts[d.server.name, d.state] = counts.get((d.server.name, d.state), 0) + 1
            in_flight.add_metric([d.server.name, d.model.name], d.in_flight)
        for s in servers:
            loaded.add_metric([s.name], counts.get((s.name, DeploymentState.LOADED), 0))
        for (server, state), n in sorted(counts.items()):
            states.add_metric([server, state], n)
        yield loaded
        yield states
        yield in_flight

        age = GaugeMetricFamily(
            "switchyard_worker_heartbeat_age_seconds",
            "Seconds since each registered worker's last heartbeat",
            labels=["worker", "host"],
        )
        live = failing = 0
        for w in Worker.objects.all():
            age.add_metric([str(w.pk), w.host], max((now - w.last_heartbeat).total_seconds(), 0))
            live += w.is_live(now)
            failing += w.is_live(now) and w.failing_since is not None
        yield age
        yield GaugeMetricFamily(
            "switchyard_workers_live",
            "Workers whose heartbeat is fresher than SWITCHYARD_WORKER_STALE_S",
            value=live,
        )
        yield GaugeMetricFamily(
            "switchyard_workers_failing",
            "Live workers whose passes fail (they serve what they run and try again)",
            value=failing,
        )


def may_scrape(request: HttpRequest) -> bool:
    """A staff session, or the metrics token as a bearer token (compared in constant time)."""
    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    bearer = given.removeprefix("Bearer ").encode()
    if token and given.startswith("Bearer ") and hmac.compare_digest(bearer, token.encode()):
        return True
    user = getattr(request, "user", None)
    return bool(user and user.is_active and user.is_staff)


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not may_scrape(request):
        refused = ApiError(
            401,
            "Metrics need a staff login or the bearer token SWITCHYARD_METRICS_TOKEN.",
            type="authentication_error",
            code="unauthorized",
        ).as_json_response()
        refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refused
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    registry.register(EtaCollector())
    registry.register(KeyUsageCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

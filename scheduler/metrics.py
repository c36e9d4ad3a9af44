"""Prometheus metrics, read from the database at scrape time so every web process reports
the same truth, whichever worker did the work."""

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from backends.models import Deployment, Server
from dashboard.metrics import EtaCollector
from scheduler.models import Priority, Request, Worker


class DatabaseCollector:
    def collect(self):
        requests = GaugeMetricFamily(
            "switchyard_requests",
            "Requests by state and priority class",
            labels=["state", "priority"],
        )
        for row in Request.objects.values("state", "priority").annotate(n=Count("id")):
            requests.add_metric([row["state"], Priority(row["priority"]).label], row["n"])
        yield requests

        deployments = GaugeMetricFamily(
            "switchyard_deployments", "Deployments by server and state", labels=["server", "state"]
        )
        in_flight = GaugeMetricFamily(
            "switchyard_in_flight", "Requests being served", labels=["server", "model"]
        )
        avg_load = GaugeMetricFamily(
            "switchyard_load_seconds_avg", "Moving average of load time", labels=["server", "model"]
        )
        for d in Deployment.objects.select_related("server", "model"):
            in_flight.add_metric([d.server.name, d.model.name], d.in_flight)
            if d.avg_load_s is not None:
                avg_load.add_metric([d.server.name, d.model.name], d.avg_load_s)
        for row in Deployment.objects.values("server__name", "state").annotate(n=Count("id")):
            deployments.add_metric([row["server__name"], row["state"]], row["n"])
        yield deployments
        yield in_flight
        yield avg_load

        up = GaugeMetricFamily(
            "switchyard_server_up", "1 if the server is healthy", labels=["server", "health"]
        )
        for s in Server.objects.filter(enabled=True):
            up.add_metric([s.name, s.health], 1.0 if s.health == "up" else 0.0)
        yield up
        yield GaugeMetricFamily(
            "switchyard_workers", "Registered workers", value=Worker.objects.count()
        )


def metrics_view(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    registry.register(EtaCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

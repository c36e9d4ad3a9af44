"""/metrics: who may scrape it, what it counts, and that every process tells the same."""

import json
import re
from datetime import timedelta

import httpx
import pytest
import yaml
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from scheduler import retention
from scheduler.models import MetricEvent, Priority, Worker
from tests import factories
from tests.scheduler.test_health import web_only

LONG_AGO = timezone.now() - timedelta(days=1)

pytestmark = pytest.mark.django_db
TOKEN = "scrape-me"


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN
    return {"Authorization": f"Bearer {TOKEN}"}


class Samples(dict):
    """(sample name, labels as pairs in any order) -> value."""

    def __getitem__(self, key: tuple) -> float:
        return super().__getitem__((key[0], frozenset(key[1])))


def samples(body: str) -> Samples:
    return Samples(
        ((s.name, frozenset(s.labels.items())), s.value)
        for family in text_string_to_metric_families(body)
        for s in family.samples
    )


def scrape(client, headers) -> dict[tuple, float]:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.content
    return samples(r.content.decode())


def test_only_staff_or_the_token_may_scrape(client, token, fast_passwords):
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers=token).status_code == 200

    users = get_user_model()
    client.force_login(users.objects.create_user("app", password="x" * 12))
    assert client.get("/metrics").status_code == 401
    client.force_login(users.objects.create_user("ops", password="x" * 12, is_staff=True))
    assert client.get("/metrics").status_code == 200


def finished(model: str, wait_s: float, run_s: float, state="completed", **fields):
    start = timezone.now() - timedelta(seconds=wait_s + run_s)
    return factories.request(
        model,
        state=state,
        created_at=start,
        started_at=start + timedelta(seconds=wait_s),
        finished_at=start + timedelta(seconds=wait_s + run_s),
        **fields,
    )


def test_gauges_counters_and_histograms(client, token):
    srv = factories.server("gpu-1")
    factories.deployment(srv, "qwen", state="loaded", in_flight=1)
    factories.request("qwen", priority=Priority.INTERACTIVE)
    finished("qwen", wait_s=0.2, run_s=3, priority=Priority.INTERACTIVE)
    finished("qwen", wait_s=40, run_s=1, priority=Priority.INTERACTIVE, attempts=3)
    finished("qwen", wait_s=1, run_s=1, state="failed")
    other = factories.server("gpu-2")
    for ran_on in (srv, srv, other):  # turns whose conversation's last turn ran on gpu-1
        finished("qwen", wait_s=1, run_s=1, server=ran_on, cache_server=srv)
    MetricEvent.record("load", "gpu-1", "qwen", 12.0)
    MetricEvent.record("load_failed", "gpu-1", "qwen")
    MetricEvent.record("load_stopped", "gpu-1", "qwen")
    MetricEvent.record("restore", "gpu-1", "qwen")
    MetricEvent.record("eviction", "gpu-1", "llama")
    MetricEvent.record("breaker_trip", "gpu-1")
    Worker.objects.create(host="a", pid=1)
    Worker.objects.create(host="b", pid=2, failing_since=timezone.now(), failing_error="KeyError")
    Worker.objects.create(host="c", pid=3, failing_since=timezone.now(), last_heartbeat=LONG_AGO)

    got = scrape(client, token)
    assert got["switchyard_workers_live", ()] == 2
    assert got["switchyard_workers_failing", ()] == 1  # of the live ones
    fast = (("class", "interactive"), ("model", "qwen"))
    assert got["switchyard_requests_waiting", (("class", "interactive"),)] == 1
    assert got["switchyard_requests_waiting", (("class", "background"),)] == 0
    assert got["switchyard_oldest_waiting_seconds", (("class", "interactive"),)] >= 0
    assert got["switchyard_models_loaded", (("server", "gpu-1"),)] == 1
    assert got["switchyard_server_up", (("server", "gpu-1"),)] == 1
    assert got["switchyard_in_flight", (("model", "qwen"), ("server", "gpu-1"))] == 1
    assert got["switchyard_requests_total", (*fast, ("outcome", "completed"))] == 2
    assert (
        got[
            "switchyard_requests_total",
            (("class", "normal"), ("model", "qwen"), ("outcome", "failed")),
        ]
        == 1
    )
    assert got["switchyard_request_retries_total", fast] == 2
    turns = (("class", "normal"), ("model", "qwen"))
    assert got["switchyard_conversation_turns_total", (*turns, ("ran_on", "last_server"))] == 2
    assert got["switchyard_conversation_turns_total", (*turns, ("ran_on", "other_server"))] == 1
    assert got["switchyard_request_wait_seconds_bucket", (*fast, ("le", "0.25"))] == 1
    assert got["switchyard_request_wait_seconds_bucket", (*fast, ("le", "60"))] == 2
    assert got["switchyard_request_wait_seconds_count", fast] == 2
    assert got["switchyard_request_wait_seconds_sum", fast] == pytest.approx(40.2, abs=0.01)
    assert got["switchyard_request_processing_seconds_bucket", (*fast, ("le", "1"))] == 1
    at = (("model", "qwen"), ("server", "gpu-1"))
    assert got["switchyard_loads_total", (*at, ("outcome", "loaded"))] == 1
    assert got["switchyard_loads_total", (*at, ("outcome", "failed"))] == 1
    assert got["switchyard_loads_total", (*at, ("outcome", "stopped"))] == 1
    assert got["switchyard_restores_total", at] == 1
    assert got["switchyard_load_duration_seconds_bucket", (("le", "10"), *at)] == 0
    assert got["switchyard_load_duration_seconds_bucket", (("le", "20"), *at)] == 1
    assert got["switchyard_evictions_total", (("model", "llama"), ("server", "gpu-1"))] == 1
    assert got["switchyard_breaker_trips_total", (("server", "gpu-1"),)] == 1


def test_a_purge_never_makes_a_counter_go_down(client, token):
    for i in range(3):
        finished("qwen", wait_s=i, run_s=1)
    MetricEvent.record("load", "gpu-1", "qwen", 5.0)
    counted = ("_total", "_bucket", "_count", "_sum")
    before = Samples((k, v) for k, v in scrape(client, token).items() if k[0].endswith(counted))

    later = timezone.now() + timedelta(days=1)
    assert retention.purge_finished(later, chunk=2) == 3
    retention.purge_events(later)
    finished("qwen", wait_s=0, run_s=1)

    after = scrape(client, token)
    completed = (
        "switchyard_requests_total",
        (("class", "normal"), ("model", "qwen"), ("outcome", "completed")),
    )
    assert before[completed] == 3 and after[completed] == 4
    for key, value in before.items():
        assert after[key] >= value, key
    assert (
        after[
            "switchyard_loads_total",
            (("model", "qwen"), ("outcome", "loaded"), ("server", "gpu-1")),
        ]
        == 1
    )


@pytest.mark.django_db(transaction=True)
def test_every_process_reports_the_same_work(served):
    """A request served by one process's worker counts the same scraped through another."""
    srv = factories.server("sim", slots=1)
    factories.deployment(srv, "m")
    one = served(SWITCHYARD_METRICS_TOKEN=TOKEN)
    other = web_only(SWITCHYARD_METRICS_TOKEN=TOKEN)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert (
            httpx.post(f"{one.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
        )
        auth = {"Authorization": f"Bearer {TOKEN}"}
        seen = [samples(httpx.get(f"{p.url}/metrics", headers=auth).text) for p in (one, other)]
        counted = [
            Samples((k, v) for k, v in s.items() if k[0].endswith(("_total", "_count", "_bucket")))
            for s in seen
        ]
        assert counted[0] == counted[1]
        loaded = (
            "switchyard_loads_total",
            (("model", "m"), ("outcome", "loaded"), ("server", "sim")),
        )
        assert counted[0][loaded] == 1, sorted(k for k in counted[0] if "load" in k[0])
        done = (
            "switchyard_requests_total",
            (("class", "normal"), ("model", "m"), ("outcome", "completed")),
        )
        assert counted[0][done] == 1
    finally:
        other.stop()


def test_openapi_schema_is_served(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/requests" in response.content


def test_the_example_dashboard_and_alerts_use_only_metrics_that_exist(client, token):
    """Every switchyard_* name in docs/monitoring is one /metrics serves."""
    srv = factories.server("gpu-1")
    factories.deployment(srv, "qwen", state="loaded")
    finished("qwen", wait_s=1, run_s=1, attempts=2)
    finished("qwen", wait_s=1, run_s=1, server=srv, cache_server=srv)  # a conversation's turn
    Worker.objects.create(host="h", pid=1)
    for kind in ("load", "eviction", "breaker_trip"):
        MetricEvent.record(kind, "gpu-1", "qwen", 1.0)
    served = {name for name, _ in scrape(client, token)}
    docs = settings.BASE_DIR / "docs" / "monitoring"
    yaml.safe_load((docs / "alerts.yml").read_text())
    json.loads((docs / "grafana-dashboard.json").read_text())
    used = set()
    for path in docs.iterdir():
        used |= set(re.findall(r"switchyard_[a-z_]+", path.read_text()))
    assert used and used <= served, used - served

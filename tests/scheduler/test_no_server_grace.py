"""Fail fast when nothing can serve (issue 34 item 5): a job may ask to wait longer than
SWITCHYARD_NO_SERVER_GRACE_S, and the grace counts from when its servers went away."""

from datetime import timedelta

import pytest
from django.utils import timezone

from backends.models import Server
from scheduler.models import Request
from scheduler.policy import plan_explained
from scheduler.store import SnapshotReader, mark_down, open_breaker, policy_config
from scheduler.store.health import probe_result, server_succeeded
from tests import factories

pytestmark = pytest.mark.django_db
HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def since(server: Server):
    return Server.objects.values_list("unavailable_since", flat=True).get(pk=server.pk)


def test_a_job_asks_for_its_own_grace_within_its_class_longest_wait(client):
    factories.deployment(factories.server("s1"), "m")
    r = client.post(
        "/api/v1/requests",
        {"body": HI, "no_server_grace_s": 600},
        content_type="application/json",
    )
    assert r.status_code == 202, r.content
    assert Request.objects.get(pk=r.json()["id"]).no_server_grace_s == 600
    for bad in (-1, 10**9):
        refused = client.post(
            "/api/v1/requests",
            {"body": HI, "no_server_grace_s": bad},
            content_type="application/json",
        )
        assert refused.status_code == 400, refused.content
        assert refused.json()["error"]["param"] == "no_server_grace_s"
        assert refused.json()["error"]["code"] == "invalid_value"  # one code either side
    assert Request.objects.count() == 1


def test_a_server_out_of_service_is_so_since_it_first_went(client):
    s1 = factories.server("s1")
    assert since(s1) is None
    mark_down(s1.pk, "refused")
    first = since(s1)
    assert first is not None
    open_breaker(Server.objects.get(pk=s1.pk), "again")  # still out: since the first time
    assert since(s1) == first
    probe_result(s1.pk, None)
    assert since(s1) is None
    Server.objects.filter(pk=s1.pk).update(enabled=False, unavailable_since=first)
    server_succeeded(s1.pk)  # healthy, but still disabled
    assert since(s1) == first


def test_the_policy_sees_both_and_counts_the_grace_from_the_later():
    """A request that waited 10 minutes behind others, whose only server went down 5 s ago,
    waits its own grace (600 s) from then; its reason says so."""
    down = factories.server("s1", health="down")
    factories.deployment(down, "m")
    now = timezone.now()
    Server.objects.filter(pk=down.pk).update(unavailable_since=now - timedelta(seconds=5))
    r = factories.request("m", no_server_grace_s=600)
    Request.objects.filter(pk=r.pk).update(created_at=now - timedelta(minutes=10))
    snapshot = SnapshotReader().read(policy_config())
    assert snapshot.servers[0].unavailable_since is not None
    assert snapshot.requests[0].no_server_grace_s == 600
    reason = plan_explained(snapshot, now).reasons[r.pk]
    assert reason.kind == "no_server"
    assert reason.detail("until") == snapshot.servers[0].unavailable_since + timedelta(seconds=600)
    assert "s1 is down since " in reason.text


def test_the_log_names_the_server_as_the_operator_named_it(caplog):
    """An operator reads "server gpu-a is down", not the row's id."""
    s1 = factories.server("gpu-a")
    with caplog.at_level("INFO", logger="scheduler.store.health"):
        mark_down(s1.pk, "refused")
    assert "server gpu-a is down: refused" in caplog.text


def test_a_job_asks_for_its_own_longest_wait(client):
    """Longer than its class's (an overnight job) or shorter (a job that is useless late);
    its no-server grace may then be as long; nothing is stored for a bad one."""
    factories.deployment(factories.server("s1"), "m")

    def submit(**fields):
        job = {"body": HI, "priority": "background", **fields}
        return client.post("/api/v1/requests", job, content_type="application/json")

    long = submit(max_wait_s=6 * 3600, no_server_grace_s=5 * 3600)
    assert long.status_code == 202, long.content
    stored = Request.objects.get(pk=long.json()["id"])
    assert (stored.expires_at - stored.created_at).total_seconds() == 6 * 3600
    short = Request.objects.get(pk=submit(max_wait_s=5).json()["id"])
    assert (short.expires_at - short.created_at).total_seconds() == 5
    for bad in (0, -1, 86_401):
        refused = submit(max_wait_s=bad)
        assert refused.status_code == 400, refused.content
        error = refused.json()["error"]
        assert (error["param"], error["code"]) == ("max_wait_s", "invalid_value")
    refused = submit(max_wait_s=60, no_server_grace_s=61)
    assert refused.json()["error"]["param"] == "no_server_grace_s"
    assert Request.objects.count() == 2

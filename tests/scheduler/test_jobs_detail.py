"""GET /api/v1/requests/{id}: a job's place in line and its ETA, as its watch page has them."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from backends.models import Deployment, DeploymentState
from dashboard import forecast
from scheduler import reasons
from scheduler.api.inference import place_and_eta
from scheduler.models import State
from tests import factories

pytestmark = pytest.mark.django_db


def detail(client, r) -> dict:
    return client.get(f"/api/v1/requests/{r.pk}").json()


def test_a_job_waiting_for_a_load_says_its_place_and_when_it_is_sent(client):
    srv = factories.server("sim", slots=1)
    now = timezone.now()
    d = factories.deployment(
        srv,
        "m",
        state=DeploymentState.LOADING,
        load_started_at=now - timedelta(seconds=1),
        avg_load_s=4.0,
        avg_inference_s=1.0,
    )
    waiting = {"state": State.NEEDS_LOADING, "server": srv, "deployment": d}
    factories.request("m", created_at=now - timedelta(seconds=3), **waiting)
    r = factories.request("m", **waiting)

    body = detail(client, r)

    assert body["position"] == 2
    # Sent when the load ends (3 s left) and the request ahead has run (1 s) on one slot.
    assert 3.5 <= body["eta_s"] <= 4.0


def test_a_job_waiting_for_a_load_its_server_reports_says_the_servers_figure(client, admin_client):
    """The jobs API, its list, a stream's waiting comment and the admin say what the
    pages' load bar says: the server's own fraction, not the estimate (1 s of ~4 s)."""
    srv = factories.server("sim", slots=1)
    started = timezone.now() - timedelta(seconds=1)
    d = factories.deployment(
        srv,
        "m",
        state=DeploymentState.LOADING,
        load_started_at=started,
        avg_load_s=4.0,
        load_progress=0.6,
    )
    loading = reasons.make(
        reasons.LOADING, "x", model="m", server="sim", started_at=started, expected_s=4.0
    )
    r = factories.request(
        "m", state=State.NEEDS_LOADING, server=srv, deployment=d, reason=loading.as_json()
    )
    said = re.compile(r"waiting for the load of m on sim, 60% after 1\.\d s, as the server reports")

    assert said.fullmatch(detail(client, r)["reason"]["text"])
    [row] = client.get("/api/v1/requests").json()["data"]
    assert said.fullmatch(row["reason"]["text"])
    assert place_and_eta(r)[2] == 0.6
    admin_list = admin_client.get("/admin/scheduler/request/").content.decode()
    assert "60% after" in admin_list and "as the server reports" in admin_list
    # Once loaded, nothing is reported: the reason goes back to the estimate's words.
    Deployment.objects.filter(pk=d.pk).update(state=DeploymentState.LOADED)
    r.refresh_from_db()
    assert place_and_eta(r)[2] is None


def test_a_running_job_says_when_it_is_expected_to_end_and_an_ended_one_nothing(client):
    srv = factories.server("sim", slots=1)
    d = factories.deployment(srv, "m", state=DeploymentState.LOADED, avg_inference_s=5.0)
    started = timezone.now() - timedelta(seconds=2)
    running = factories.request(
        "m", state=State.PROCESSING, server=srv, deployment=d, started_at=started
    )
    ended = factories.request("m", state=State.COMPLETED, finished_at=timezone.now())

    assert 2.5 <= detail(client, running)["eta_s"] <= 3.0
    assert (detail(client, ended)["position"], detail(client, ended)["eta_s"]) == (None, None)


def test_a_job_of_a_model_never_run_here_has_an_eta_by_the_defaults(client):
    srv = factories.server("sim", slots=1)
    factories.deployment(srv, "m", state=DeploymentState.UNLOADED)
    r = factories.request("m")

    body = detail(client, r)

    assert body["position"] == 1
    assert body["eta_s"] == forecast.DEFAULT_LOAD_S  # sent once loaded, at the default time

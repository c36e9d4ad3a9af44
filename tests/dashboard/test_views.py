"""The staff pages: login required, and they render the state they will then follow."""

import json
import re

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders

from dashboard.watch_tokens import token_for
from scheduler.models import State
from tests import factories

pytestmark = pytest.mark.django_db

PAGES = ["/", "/dashboard/state.json"]


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create(username="op", is_staff=True))
    return client


def initial_state(response) -> dict:
    html = response.content.decode()
    start = html.index('<script id="initial-state" type="application/json">')
    body = html[start:].split(">", 1)[1].split("</script>", 1)[0]
    return json.loads(body)


@pytest.mark.parametrize("path", PAGES + ["/requests/00000000-0000-0000-0000-000000000000/"])
def test_anonymous_is_sent_to_the_admin_login(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


@pytest.mark.parametrize("path", PAGES)
def test_non_staff_is_sent_to_the_admin_login(client, path):
    client.force_login(User.objects.create(username="app-user"))
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_the_dashboard_renders_servers_and_the_line(staff):
    factories.server("sim-1", kind="simulated")
    waiting = factories.request("m")
    response = staff.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    for hook in ('id="servers"', 'id="waiting"', 'id="running"', 'id="recent"', "/ws/dashboard/"):
        assert hook in html
    state = initial_state(response)
    assert [s["name"] for s in state["servers"]] == ["sim-1"]
    assert state["servers"][0]["simulated"] is True
    assert [r["id"] for r in state["waiting"]] == [str(waiting.pk)]


def test_the_request_page_renders_one_request(staff):
    r = factories.request("m", state=State.COMPLETED)
    response = staff.get(f"/requests/{r.pk}/")
    assert response.status_code == 200
    assert f"/ws/requests/{r.pk}/" in response.content.decode()
    assert initial_state(response)["state"] == "completed"
    assert staff.get(f"/requests/{r.pk}/state.json").json()["id"] == str(r.pk)


def test_an_unknown_request_is_404(staff):
    unknown = "00000000-0000-0000-0000-000000000000"
    assert staff.get(f"/requests/{unknown}/").status_code == 404
    assert staff.get(f"/requests/{unknown}/state.json").status_code == 404


def test_the_state_json_is_the_overview(staff):
    factories.request("m")
    body = staff.get("/dashboard/state.json").json()
    assert body["waiting_total"] == 1
    assert body["waiting"][0]["position"] == 1


def test_every_page_names_an_icon_that_exists(staff):
    """Browsers ask each page for an icon: without one named, every visit logs a 404 for
    /favicon.ico. The dashboard, a watch page and the admin name one that is there."""
    r = factories.request("m")
    for path in ["/", f"/watch/{token_for(r.pk)}/", "/admin/"]:
        html = staff.get(path).content.decode()
        icon = re.search(r'<link rel="icon" href="/static/([^"]+)"', html)
        assert icon, f"{path} names no icon"
        assert finders.find(icon.group(1)), f"{path}'s icon {icon.group(1)} is missing"

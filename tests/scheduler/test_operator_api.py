"""The operator API: who may call it, what it refuses, and intents carried out by a live
process's worker."""

import os
import time

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.middleware.csrf import get_token
from django.test import Client

from backends.models import Deployment, Server
from scheduler.models import Callback, Intent
from tests import factories
from tests.conftest import database_url, free_port
from tests.scheduler.test_health import web_only
from tests.support.admin_pages import assert_renders_with_each_filter
from tests.support.manage_process import ManageProcess
from tests.support.openai_upstream import Upstream

pytestmark = pytest.mark.usefixtures("fast_passwords")


def login(staff: bool = True) -> dict[str, str]:
    """A session's cookies and its CSRF header, as a browser logged in would send them."""
    user = get_user_model().objects.create_user(
        "ops" if staff else "app", password="x" * 12, is_staff=staff
    )
    client = Client()
    client.force_login(user)
    http = HttpRequest()
    token = get_token(http)
    return {
        "Cookie": f"sessionid={client.cookies['sessionid'].value};"
        f" csrftoken={http.META['CSRF_COOKIE']}",
        "X-CSRFToken": token,
    }


@pytest.mark.django_db
def test_refusals(client):
    srv = factories.server("gpu-1")
    factories.deployment(
        srv, "a", state="loaded", in_flight=1, slots=2, avg_load_s=4.56789, avg_inference_s=1.5
    )
    Deployment.objects.filter(model__name="a").update(load_cause="outside")
    factories.deployment(srv, "b", expected_load_s=90, preload=True, idle_ttl_s=600)
    factories.deployment(srv, "off", enabled=False)
    assert client.get("/api/v1/servers").status_code == 401
    users = get_user_model()
    client.force_login(users.objects.create_user("app", password="x" * 12))
    r = client.get("/api/v1/servers")
    assert (r.status_code, r.json()["error"]["code"]) == (403, "permission_denied")
    client.force_login(users.objects.create_user("ops", password="x" * 12, is_staff=True))

    def post(path, body=None):
        r = client.post(path, body or {}, content_type="application/json")
        return r.status_code, r.json()["error"]["code"]

    assert post("/api/v1/servers/nope/drain") == (404, "server_not_found")
    assert post("/api/v1/servers/gpu-1/load", {"model": "zzz"}) == (404, "model_not_deployed")
    assert post("/api/v1/servers/gpu-1/load", {"model": "a"}) == (409, "already_loaded")
    assert post("/api/v1/servers/gpu-1/load", {"model": "off"}) == (409, "model_disabled")
    assert post("/api/v1/servers/gpu-1/load", {}) == (400, "invalid")
    assert post("/api/v1/servers/gpu-1/load", {"model": "b", "optons": {}}) == (400, "invalid")
    assert post("/api/v1/servers/gpu-1/unload", {"model": "b"}) == (404, "model_not_loaded")
    # A router sets each model's arguments in its preset: options it would drop are refused.
    factories.deployment(factories.server("router", kind="llamacpp"), "b")
    assert post("/api/v1/servers/router/load", {"model": "b", "options": {"ctx": 8192}}) == (
        400,
        "load_options_not_taken",
    )
    assert post("/api/v1/servers/gpu-1/unload", {"model": "a", "force": False}) == (
        409,
        "model_busy",
    )
    assert Intent.objects.count() == 0
    # force (the default): recorded, to run once its request finishes.
    r = client.post("/api/v1/servers/gpu-1/unload", {"model": "a"}, content_type="application/json")
    assert r.status_code == 202
    assert (r.json()["status"], r.json()["force"]) == ("pending", True)
    assert r.json()["trace"][0]["reason"] == "asked by user ops through the API"
    # Followed at its own address, as the answer's Location and `url` say.
    url = f"/api/v1/intents/{r.json()['id']}"
    assert r.headers["Location"] == r.json()["url"] == url
    assert client.get(url).json() == r.json()
    listed = client.get("/api/v1/servers").json()["data"][0]
    assert listed["intents"][0]["id"] == r.json()["id"]
    assert listed["room"] == {"llm": 1, "embedding": 1, "reranking": 1, "in_all": None}
    assert client.get("/api/v1/servers/gpu-1").json() == listed
    assert client.get("/api/v1/servers/nope").json()["error"]["code"] == "server_not_found"
    # All of them, newest first, by server and status, a page at a time.
    page = client.get("/api/v1/intents?server=gpu-1&status=pending&limit=1").json()
    assert ([i["id"] for i in page["data"]], page["has_more"]) == ([r.json()["id"]], False)
    assert client.get("/api/v1/intents?status=done").json()["data"] == []
    assert client.get("/api/v1/intents?server=gpu-2").json()["data"] == []
    wrong = client.get("/api/v1/intents?status=finished").json()["error"]
    assert (wrong["code"], wrong["param"]) == ("invalid_value", "status")
    missing = client.get("/api/v1/intents/999", {"wait_s": 5})  # refused at once, no wait
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "intent_not_found")
    for bad, code in (("soon", "invalid_type"), ("-1", "invalid_value"), ("nan", "invalid_value")):
        refused = client.get(url, {"wait_s": bad}).json()["error"]
        assert (refused["code"], refused["param"]) == (code, "wait_s")
    # No worker runs here: a short long poll ends with the intent as it still is.
    assert client.get(url, {"wait_s": "0.01"}).json()["status"] == "pending"
    client.logout()
    assert client.get(url).status_code == 401
    assert client.get(url, {"wait_s": 5}).status_code == 401
    assert client.get("/api/v1/servers/gpu-1").status_code == 401
    client.force_login(users.objects.get(username="app"))
    assert client.get(url).json()["error"]["code"] == "permission_denied"
    assert client.get("/api/v1/servers/gpu-1").json()["error"]["code"] == "permission_denied"
    client.force_login(users.objects.get(username="ops"))
    assert [
        (d["model"], d["state"], d["in_flight"], d["slots"], d["enabled"])
        for d in listed["deployments"]
    ] == [
        ("a", "loaded", 1, 2, True),
        ("b", "unloaded", 0, None, True),
        ("off", "unloaded", 0, None, False),
    ]
    # Its load and run times as measured, and the load its operator expects before that.
    assert [
        (d["avg_load_s"], d["expected_load_s"], d["avg_inference_s"]) for d in listed["deployments"]
    ] == [(4.568, None, 1.5), (None, 90, None), (None, None, None)]  # to the ms
    # What brings it in and takes it out, and who asked for its last load.
    assert [(d["preload"], d["idle_ttl_s"], d["load_cause"]) for d in listed["deployments"]] == [
        (False, None, "outside"),
        (True, 600, ""),
        (False, None, ""),
    ]


def until_done(live, headers, intent_id: int) -> Intent:
    """The intent once it has finished, as one long poll (`?wait_s=`) answers it; the
    servers' listing no longer shows it then."""
    url = f"{live.url}/api/v1/intents/{intent_id}"
    shown = httpx.get(url, params={"wait_s": 30}, headers=headers, timeout=40).json()
    assert shown["status"] in ("done", "failed"), shown
    servers = httpx.get(f"{live.url}/api/v1/servers", headers=headers).json()["data"]
    assert not any(i["id"] == intent_id for s in servers for i in s["intents"])
    assert shown["finished_at"] and shown["trace"][-1]["status"] == shown["status"]
    return Intent.objects.get(pk=intent_id)


@pytest.mark.django_db(transaction=True)
def test_intents_run_through_the_scheduler(served):
    srv = factories.server("sim", slots=1, max_llm=1)
    factories.deployment(srv, "a")
    factories.deployment(srv, "b")
    live = served()
    headers = login()

    def ask(action: str, body: dict | None = None) -> httpx.Response:
        url = f"{live.url}/api/v1/servers/sim/{action}"
        return httpx.post(url, json=body or {}, headers=headers)

    no_csrf = {"Cookie": headers["Cookie"]}
    refused = httpx.post(f"{live.url}/api/v1/servers/sim/drain", headers=no_csrf)
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]["message"]

    # A load's options apply to that load only: one that fails it does not stay behind.
    r = ask("load", {"model": "a", "options": {"fail_load": True}})
    assert r.status_code == 202, r.text
    assert (r.json()["options"], r.json()["force"]) == ({"fail_load": True}, None)
    done = until_done(live, headers, r.json()["id"])
    assert (done.status, done.outcome) == ("failed", "the load failed: simulated load failure")
    own = {"load_seconds": 0.01, "tokens_per_second": 10_000}
    assert Deployment.objects.get(model__name="a").load_options == own

    r = ask("load", {"model": "a", "options": {"load_seconds": 0.02}})
    done = until_done(live, headers, r.json()["id"])
    assert done.status == "done", done.outcome
    assert [t.status for t in done.traces.all()] == ["pending", "running", "done"]
    a = Deployment.objects.get(model__name="a")
    assert a.state == "loaded" and a.load_options == own
    assert a.load_overrides == {"load_seconds": 0.02}
    listed = httpx.get(f"{live.url}/api/v1/servers", headers=headers).json()["data"][0]
    assert listed["deployments"][0]["load_overrides"] == {"load_seconds": 0.02}

    assert ask("load", {"model": "a"}).json()["error"]["code"] == "already_loaded"
    done = until_done(live, headers, ask("load", {"model": "b"}).json()["id"])
    assert [t.reason for t in done.traces.all()][1] == "load started, evicting a"
    states = dict(Deployment.objects.values_list("model__name", "state"))
    assert states == {"a": "unloaded", "b": "loaded"}

    done = until_done(live, headers, ask("unload", {"model": "b"}).json()["id"])
    assert done.status == "done"
    assert Deployment.objects.get(model__name="b").state == "unloaded"
    # The next load of a, asked without options, has none of the last one's.
    done = until_done(live, headers, ask("load", {"model": "a"}).json()["id"])
    assert done.status == "done", done.outcome
    a = Deployment.objects.get(model__name="a")
    assert (a.state, a.load_overrides, a.load_options) == ("loaded", {}, own)
    until_done(live, headers, ask("unload", {"model": "a"}).json()["id"])

    until_done(live, headers, ask("drain").json()["id"])
    assert not Server.objects.get().enabled
    until_done(live, headers, ask("enable").json()["id"])
    assert Server.objects.get().enabled

    # Every intent, finished ones too, newest first, a page at a time.
    url = f"{live.url}/api/v1/intents"
    first = httpx.get(url, params={"server": "sim", "limit": 2}, headers=headers).json()
    assert first["has_more"] and [i["action"] for i in first["data"]] == ["enable", "drain"]
    params = {"server": "sim", "limit": 2, "cursor": first["next_cursor"]}
    second = httpx.get(url, params=params, headers=headers).json()
    assert [(i["action"], i["model"]) for i in second["data"]][0] == ("unload", "a")


@pytest.mark.django_db
def test_intents_and_callbacks_in_the_admin(admin_client):
    srv = factories.server("gpu-1")
    d = factories.deployment(srv, "a")
    intent = Intent.objects.create(server=srv, action="load", deployment=d, requested_by="ops")
    intent.traces.create(status="pending", reason="asked by ops through the API")
    request = factories.request("a")
    Callback.objects.create(request=request, last_error="HTTP 500")
    for changelist, filters in [
        ("/admin/scheduler/intent/", ["status=pending", "action=load"]),
        ("/admin/scheduler/callback/", ["status=waiting"]),
    ]:
        assert_renders_with_each_filter(admin_client, changelist, filters)
    page = admin_client.get(f"/admin/scheduler/intent/{intent.pk}/change/").content.decode()
    assert "asked by ops through the API" in page


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="a wake-up across processes is a NOTIFY")
@pytest.mark.django_db(transaction=True)
def test_a_worker_in_another_process_carries_out_an_intent_at_once():
    """The web process's NOTIFY wakes the worker: no wait for its poll (60 s here)."""
    srv = factories.server("sim", slots=1)
    factories.deployment(srv, "a")
    web = web_only()
    env = {**os.environ, "DATABASE_URL": database_url(), "SWITCHYARD_POLL_INTERVAL_S": "60"}
    worker = ManageProcess(["run_scheduler"], env, lambda line: " started" in line)
    try:
        headers = login()
        started = time.monotonic()
        r = httpx.post(f"{web.url}/api/v1/servers/sim/load", json={"model": "a"}, headers=headers)
        done = until_done(web, headers, r.json()["id"])
        assert done.status == "done", done.outcome
        assert time.monotonic() - started < 30
    finally:
        web.stop()
        worker.proc.terminate()
        worker.output(timeout=30)


@pytest.mark.django_db
def test_servers_are_listed_a_page_at_a_time_in_the_jobs_lists_shape(admin_client):
    for name in ["gpu-3", "gpu-1", "gpu-2"]:
        factories.deployment(factories.server(name), f"m-{name}", state="loaded", in_flight=1)
    everything = admin_client.get("/api/v1/servers").json()
    assert (everything["object"], everything["has_more"], everything["next_cursor"]) == (
        "list",
        False,
        None,
    )
    assert [s["name"] for s in everything["data"]] == ["gpu-1", "gpu-2", "gpu-3"]
    seen, cursor = [], None
    for _ in range(3):
        body = admin_client.get("/api/v1/servers", {"limit": 1, "cursor": cursor or ""}).json()
        seen += [(s["name"], [d["model"] for d in s["deployments"]]) for s in body["data"]]
        cursor = body["next_cursor"]
        assert body["has_more"] == (cursor is not None)
    assert seen == [(f"gpu-{i}", [f"m-gpu-{i}"]) for i in (1, 2, 3)] and cursor is None
    r = admin_client.get("/api/v1/servers", {"cursor": "!!not-ours"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_value")


@pytest.mark.django_db
def test_sync_adds_what_a_server_lists_and_says_so(client):
    """Discovery over HTTP, as `sync_models` does it: against a real HTTP server that lists
    two models; one that does not answer is a 502 that changes nothing."""
    upstream = Upstream(["qwen3-8b", "nomic-embed"])
    try:
        factories.server("up", kind="openai", base_url=upstream.url)
        factories.server("gone", kind="openai", base_url=f"http://127.0.0.1:{free_port()}")
        users = get_user_model()
        client.force_login(users.objects.create_user("ops", password="x" * 12, is_staff=True))

        synced = client.post("/api/v1/servers/up/sync")

        assert synced.status_code == 200
        body = synced.json()
        assert (body["server"], body["listed"]) == ("up", 2)
        assert sorted(body["created_models"]) == ["nomic-embed", "qwen3-8b"]
        assert Deployment.objects.filter(server__name="up").count() == 2
        again = client.post("/api/v1/servers/up/sync").json()
        assert again["created_deployments"] == []
        failed = client.post("/api/v1/servers/gone/sync")
        assert (failed.status_code, failed.json()["error"]["code"]) == (502, "server_unreachable")
        assert not Deployment.objects.filter(server__name="gone").exists()
        assert client.post("/api/v1/servers/nope/sync").status_code == 404
    finally:
        upstream.close()


@pytest.mark.django_db
def test_check_says_what_is_wrong_with_a_server_as_data(client):
    upstream = Upstream(["qwen3-8b"])
    try:
        srv = factories.server("up", kind="openai", base_url=upstream.url)
        factories.deployment(srv, "typo", server_model_id="qwen3-8B")
        assert client.get("/api/v1/servers/up/check").status_code == 401
        users = get_user_model()
        client.force_login(users.objects.create_user("ops", password="x" * 12, is_staff=True))

        body = client.get("/api/v1/servers/up/check").json()

        assert (body["server"], body["worst"]) == ("up", "error")
        assert body["findings"][0] == {
            "level": "ok",
            "text": f"answers at {upstream.url} as openai",
        }
        assert any("lists no 'qwen3-8B'" in f["text"] for f in body["findings"])
        assert client.get("/api/v1/servers/nope/check").status_code == 404
    finally:
        upstream.close()

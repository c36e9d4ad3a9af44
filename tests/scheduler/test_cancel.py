"""Cancelling a request at its server, through a live Switchyard (`manage.py serve`): a
request cancelled while processing (through the API, in the admin, or by its caller
hanging up) ends `cancelled`, its call to the server is closed (as llama-server, vLLM and
Ollama take it: they stop generating), and its slot is free for the next request."""

import json

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from backends.models import Deployment
from scheduler.models import Request, State
from scheduler.store import cancel_request
from tests import factories
from tests.support.polling import eventually
from tests.support.switchyard_processes import Switchyard

from .test_limits import CHAT, finished, post_and_keep_open

# Where the web process and the worker run: in one process (`serve`), whose worker hears of
# a cancel at once, or apart (on PostgreSQL with Redis), where it hears by NOTIFY.
SHAPES = ["one process", "apart"] if settings.IS_POSTGRES else ["one process"]


@pytest.fixture(params=["one process"])
def gated(request, served, gated_upstream):
    """One slot on an upstream that holds every answer at its gate."""
    up = factories.server("up", kind="openai", base_url=gated_upstream.url, slots=1)
    factories.deployment(up, "m1", state="loaded")
    if request.param == "one process":
        return served(), gated_upstream
    apart = Switchyard({})
    request.addfinalizer(apart.stop)
    return apart, gated_upstream


def processing(live, upstream) -> Request:
    """Submit a job and wait until its call is at the upstream's gate (a request cancelled
    while processing but before its call is made never reaches the server at all)."""
    job = {"kind": "chat", "body": {"model": "m1", **CHAT}}
    answer = httpx.post(f"{live.url}/api/v1/requests", json=job, timeout=30)
    assert answer.status_code == 202
    request = Request.objects.get(pk=answer.json()["id"])
    assert upstream.arrived.wait(30)
    eventually(lambda: Request.objects.get(pk=request.pk).state == State.PROCESSING)
    return request


def assert_stopped_and_slot_free(live, upstream, request: Request, reason: str) -> None:
    """Cancelled from processing with `reason` (its error, as a failed one's says why); the
    upstream saw its caller hang up; the deployment's slot is free, and the next request is
    served in it."""
    assert upstream.hung_up.wait(30), "the call to the server was not closed"
    shown = finished(live, request)
    assert shown["state"] == State.CANCELLED
    assert (shown["error_code"], shown["error"]) == ("cancelled", reason)
    last = shown["trace"][-1]
    assert (last["from_state"], last["to_state"]) == ("processing", "cancelled")
    assert reason in last["reason"] and last["server"] == "up"
    assert Deployment.objects.get(model__name="m1").in_flight == 0
    upstream.gate.set()
    upstream.arrived.clear()
    again = httpx.post(f"{live.url}/v1/chat/completions", json={"model": "m1", **CHAT}, timeout=30)
    assert again.status_code == 200
    assert again.json()["choices"][0]["message"]["content"] == "Hello from upstream"


@pytest.mark.parametrize("gated", SHAPES, indirect=True)
def test_delete_stops_a_processing_request_at_its_server(gated):
    live, upstream = gated
    request = processing(live, upstream)
    answer = httpx.delete(f"{live.url}/api/v1/requests/{request.pk}", timeout=30)
    assert answer.status_code == 200 and answer.json()["state"] == State.CANCELLED
    assert_stopped_and_slot_free(live, upstream, request, "cancelled through the API")
    # Ended: a second DELETE changes nothing and says why.
    again = httpx.delete(f"{live.url}/api/v1/requests/{request.pk}", timeout=30)
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_cancellable"
    assert "cancelled" in again.json()["error"]["message"]


def test_a_streaming_caller_whose_request_is_cancelled_is_told_so(gated):
    """DELETE while the caller streams: the stream ends with a `cancelled` error event and
    [DONE], and the call to the server is closed."""
    live, upstream = gated
    body = {"model": "m1", "stream": True, **CHAT}
    with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        request_id = next(lines).removeprefix(": queued as ")
        assert upstream.arrived.wait(30)
        eventually(lambda: Request.objects.get(pk=request_id).state == State.PROCESSING)
        assert httpx.delete(f"{live.url}/api/v1/requests/{request_id}").status_code == 200
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    told = json.loads(events[-2])["error"]
    assert (told["code"], told["message"]) == (
        "cancelled",
        "the request was cancelled: cancelled through the API",
    )
    assert upstream.hung_up.wait(30)


def admin_session(live) -> httpx.Client:
    """An operator logged in to the live process's admin, as a browser would be."""
    get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    browser = httpx.Client(base_url=live.url, timeout=30)
    browser.get("/admin/login/")
    form = {"username": "op", "password": "pw", "next": "/admin/"}
    token = {"csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    assert browser.post("/admin/login/", data=form | token).status_code == 302
    return browser


def test_the_admin_action_stops_a_processing_request(gated):
    """The action runs in the web process, which tells the worker (in the same process on
    the embedded default; by NOTIFY on PostgreSQL)."""
    live, upstream = gated
    request = processing(live, upstream)
    browser = admin_session(live)
    action = {"action": "cancel", "_selected_action": [str(request.pk)]}
    token = {"csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    answer = browser.post("/admin/scheduler/request/", data=action | token, follow_redirects=True)
    assert "Cancelled 1 request(s)." in answer.text
    assert_stopped_and_slot_free(live, upstream, request, "cancelled in admin by op")


@pytest.mark.parametrize("gated", SHAPES, indirect=True)
@pytest.mark.parametrize("stream", [False, True])
def test_a_caller_that_hangs_up_while_processing_stops_its_request(gated, stream):
    """Nobody is left to read the answer: the server stops generating it."""
    live, upstream = gated
    body = {"model": "m1", "stream": stream, **CHAT}
    caller = post_and_keep_open(live, "/v1/chat/completions", body)
    assert upstream.arrived.wait(30)
    caller.close()
    request = Request.objects.get(model_name="m1")
    assert_stopped_and_slot_free(live, upstream, request, "the caller disconnected")


def test_a_caller_with_an_idempotency_key_that_hangs_up_is_not_cancelled(gated):
    """Its retry is expected to pick the answer up: it runs to its end. Beside it, a caller
    without a key hangs up just after it: once that one's call is closed, the first hang-up
    has been heard too, and changed nothing."""
    live, upstream = gated
    beside = factories.server("up-2", kind="openai", base_url=upstream.url, slots=1)
    factories.deployment(beside, "m2", server_model_id="m1", state="loaded")
    kept_caller = post_and_keep_open(
        live, "/v1/chat/completions", {"model": "m1", **CHAT}, {"Idempotency-Key": "once"}
    )
    plain_caller = post_and_keep_open(live, "/v1/chat/completions", {"model": "m2", **CHAT})
    eventually(lambda: len(upstream.received) == 2)
    kept_caller.close()
    plain_caller.close()
    assert upstream.hung_up.wait(30)
    upstream.gate.set()
    kept = finished(live, Request.objects.get(model_name="m1"))
    assert kept["state"] == State.COMPLETED
    assert finished(live, Request.objects.get(model_name="m2"))["state"] == State.CANCELLED
    assert len(upstream.dropped) == 1


@pytest.mark.django_db
def test_cancel_request_frees_one_slot_once_and_leaves_ended_requests_alone():
    sim = factories.server("s")
    busy = factories.deployment(sim, "m", state="loaded", in_flight=2)
    first, second = (
        factories.request("m", state=State.PROCESSING, server=sim, deployment=busy)
        for _ in range(2)
    )
    orphan = factories.request("m", state=State.PROCESSING, server=sim)  # its model deleted
    ended = factories.request("m", state=State.COMPLETED)

    assert cancel_request(first.pk, "cancelled through the API")
    assert Deployment.objects.get(pk=busy.pk).in_flight == 1  # the other still runs
    assert not cancel_request(first.pk, "again")  # ended: its slot is not freed twice
    assert Deployment.objects.get(pk=busy.pk).in_flight == 1
    assert cancel_request(orphan.pk, "cancelled through the API")
    assert not cancel_request(ended.pk, "too late")
    states = dict(Request.objects.values_list("pk", "state"))
    assert [states[r.pk] for r in (first, second, orphan, ended)] == [
        State.CANCELLED,
        State.PROCESSING,
        State.CANCELLED,
        State.COMPLETED,
    ]

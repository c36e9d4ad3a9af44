"""Job callbacks: refused at submit unless to an allowed host; delivered signed by a live
process's worker, retried with backoff, every attempt in the request's trace."""

import hashlib
import hmac
import json
import queue

import httpx
import pytest

from scheduler.models import Callback, Request
from tests import factories
from tests.support.local_server import Handler, LocalServer

SECRET = "s3cret"
HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Receiver(LocalServer):
    """Answers each POST with the next status of `statuses` (then 200), and queues what it
    received."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.received: queue.Queue = queue.Queue()
        super().__init__()

    def handler(self):
        receiver = self

        class Callbacks(Handler):
            def do_POST(self) -> None:
                body = self.read_body()
                receiver.received.put((self.headers_seen(), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_json(status, {})

        return Callbacks


@pytest.fixture
def receiver():
    with Receiver([500]) as r:
        yield r


@pytest.mark.django_db
@pytest.mark.parametrize(
    "hosts, url, code",
    [
        ("", "http://127.0.0.1:9/hook", "callbacks_disabled"),
        ("hooks.example", "http://127.0.0.1:9/hook", "callback_host_not_allowed"),
        ("hooks.example", "ftp://hooks.example/x", "invalid_value"),
        ("hooks.example", "http://user:pw@hooks.example/x", "invalid_value"),
        ("hooks.example", 42, "invalid_value"),
    ],
)
def test_a_callback_to_a_host_not_allowed_is_refused_and_stores_nothing(
    client, settings, hosts, url, code
):
    settings.WEBHOOK_HOSTS = [h for h in hosts.split(",") if h]
    settings.WEBHOOK_SECRET = SECRET
    factories.deployment(factories.server("sim"), "m")
    job = {"kind": "chat", "body": HI, "callback_url": url}
    r = client.post("/api/v1/requests", job, content_type="application/json")
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("callback_url", code)
    assert Request.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_final_state_is_posted_signed_and_retried(served, receiver):
    factories.deployment(factories.server("sim"), "m")
    live = served(SWITCHYARD_WEBHOOK_HOSTS="127.0.0.1", SWITCHYARD_WEBHOOK_SECRET=SECRET)
    job = {"kind": "chat", "body": HI, "callback_url": f"{receiver.url}/hook?x=1"}
    r = httpx.post(f"{live.url}/api/v1/requests", json=job)
    assert r.status_code == 202, r.text
    request_id = r.json()["id"]

    for _ in range(2):  # the first answered 500, the second 200
        headers, body = receiver.received.get(timeout=30)
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-Switchyard-Signature"] == expected
        assert headers["X-Switchyard-Request-Id"] == request_id
        sent = json.loads(body)
        assert (sent["id"], sent["state"]) == (request_id, "completed")
        assert sent["result"]["choices"]

    def delivered():
        return Callback.objects.filter(pk=request_id, status="delivered").exists()

    for _ in range(1000):  # recorded just after the answer: each look a real query
        if delivered():
            break
    callback = Callback.objects.get(pk=request_id)
    assert (callback.status, callback.attempts) == ("delivered", 2)
    reasons = list(Request.objects.get(pk=request_id).traces.values_list("reason", flat=True))
    assert "callback to 127.0.0.1 failed: HTTP 500; attempt 2 in 1 s" in reasons
    assert reasons[-1] == "callback delivered to 127.0.0.1 (attempt 2)"
    assert receiver.received.empty()

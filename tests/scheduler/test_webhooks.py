"""Job callbacks: refused at submit unless to an allowed host; delivered signed by a live
process's worker, retried with backoff, every attempt in the request's trace."""

import hashlib
import hmac
import json
import queue

import httpx
import pytest

from access import auth as keys
from access.models import ApiKey
from scheduler.models import Callback, Request
from scheduler.webhooks import secret_for
from tests import factories
from tests.support.local_server import Handler, LocalServer
from tests.support.polling import eventually

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
    # Sent when the request ends and retried at its time (1 s after the first attempt), not
    # at the next poll (there is none within the test).
    live = served(
        SWITCHYARD_WEBHOOK_HOSTS="127.0.0.1",
        SWITCHYARD_WEBHOOK_SECRET=SECRET,
        SWITCHYARD_POLL_INTERVAL_S="300",
        SWITCHYARD_STATUS_SYNC_S="300",
    )
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

    eventually(delivered)  # recorded just after the receiver's answer
    callback = Callback.objects.get(pk=request_id)
    assert (callback.status, callback.attempts) == ("delivered", 2)
    reasons = list(Request.objects.get(pk=request_id).traces.values_list("reason", flat=True))
    assert "callback to 127.0.0.1 failed: HTTP 500; attempt 2 in 1 s" in reasons
    assert reasons[-1] == "callback delivered to 127.0.0.1 (attempt 2)"
    assert receiver.received.empty()


def signed_with(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.mark.django_db(transaction=True)
def test_a_keys_job_is_signed_with_that_keys_own_secret(served):
    """Keys required, and no global secret at all: each key's callbacks are signed with its
    own secret, which a receiver on 127.0.0.1 checks."""
    factories.deployment(factories.server("sim"), "m")
    keys = [ApiKey.generate(name) for name in ("team-a", "team-b")]
    for api_key, _ in keys:
        api_key.save()
    live = served(SWITCHYARD_AUTH="required", SWITCHYARD_WEBHOOK_HOSTS="127.0.0.1")
    with Receiver([]) as receiver:
        sent = {}
        for api_key, key in keys:
            job = {"kind": "chat", "body": HI, "callback_url": f"{receiver.url}/hook"}
            headers = {"Authorization": f"Bearer {key}"}
            r = httpx.post(f"{live.url}/api/v1/requests", json=job, headers=headers)
            assert r.status_code == 202, r.text
            sent[r.json()["id"]] = api_key.webhook_secret
        for _ in sent:
            headers, body = receiver.received.get(timeout=30)
            secret = sent[headers["X-Switchyard-Request-Id"]]
            assert hmac.compare_digest(headers["X-Switchyard-Signature"], signed_with(secret, body))
            others = [s for s in sent.values() if s != secret]
            assert headers["X-Switchyard-Signature"] != signed_with(others[0], body)
        # The worker records a delivery (and logs it) once the receiver has answered.
        eventually(lambda: Callback.objects.filter(status="delivered").count() == len(sent))
    said = live.stop()
    assert "callback delivered" in said
    assert not any(secret in said for secret in sent.values())  # never in a log


@pytest.mark.django_db
def test_the_secret_a_callback_is_signed_with(settings):
    settings.WEBHOOK_SECRET = SECRET
    with_key, _ = ApiKey.generate("a")
    with_key.save()
    older, _ = ApiKey.generate("b", webhook_secret="")  # a key made before keys had one
    older.save()
    assert secret_for(factories.request("m", api_key=with_key)) == with_key.webhook_secret
    assert secret_for(factories.request("m", api_key=older)) == SECRET
    assert secret_for(factories.request("m")) == SECRET  # SWITCHYARD_AUTH=off: no key


@pytest.mark.auth
@pytest.mark.django_db
def test_with_a_keys_own_secret_no_global_one_is_needed(client, settings):
    settings.WEBHOOK_HOSTS, settings.WEBHOOK_SECRET = ["hooks.example"], ""
    keys.forget()
    factories.deployment(factories.server("sim"), "m")
    job = {"kind": "chat", "body": HI, "callback_url": "https://hooks.example/x"}

    def submit(key: str):
        return client.post(
            "/api/v1/requests", job, content_type="application/json", headers=auth(key)
        )

    api_key, key = ApiKey.generate("a")
    api_key.save()
    assert submit(key).status_code == 202
    older, old_key = ApiKey.generate("b", webhook_secret="")
    older.save()
    r = submit(old_key)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "callbacks_disabled")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}

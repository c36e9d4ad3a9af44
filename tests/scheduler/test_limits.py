"""Limits through a live Switchyard (`manage.py serve`): the bounded queue, the longest wait
per class, and callers who hang up while waiting (while processing: test_cancel.py)."""

import json
import socket

import httpx

from scheduler.models import Priority, Request, State
from tests import factories

LONG_LOAD_S = 600  # never finishes within a test: requests for it keep waiting
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def post_and_keep_open(
    live, path: str, body: dict, headers: dict[str, str] | None = None
) -> socket.socket:
    """A raw HTTP caller, so that a test decides when it hangs up."""
    sock = socket.create_connection(("127.0.0.1", live.port))
    data = json.dumps(body).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def finished(live, request: Request) -> dict:
    """The request as the API shows it once terminal (the server long-polls for us)."""
    url = f"{live.url}/api/v1/requests/{request.pk}"
    return httpx.get(url, params={"wait_s": 30}, timeout=40).json()


def test_a_full_queue_answers_429_with_retry_after_and_stores_nothing(served):
    factories.deployment(factories.server("s1"), "slow", load_s=LONG_LOAD_S)
    factories.request("slow", priority=Priority.BACKGROUND)  # waits for the long load
    live = served(SWITCHYARD_MAX_QUEUE="3", SWITCHYARD_MAX_QUEUE_BACKGROUND="1")

    def submit(priority: str) -> httpx.Response:
        body = {"kind": "chat", "priority": priority, "body": {"model": "slow", **CHAT}}
        return httpx.post(f"{live.url}/api/v1/requests", json=body, timeout=30)

    # The background class is full (1), although the whole queue (3) is not.
    full = submit("background")
    assert full.status_code == 429
    assert full.headers["Retry-After"] == "5"
    assert full.json()["error"]["code"] == "queue_full"
    assert full.json()["error"]["type"] == "rate_limit_error"
    assert Request.objects.count() == 1

    assert [submit("normal").status_code for _ in range(2)] == [202, 202]
    # Now the whole queue is full: the OpenAI endpoint refuses too.
    refused = httpx.post(
        f"{live.url}/v1/chat/completions", json={"model": "slow", **CHAT}, timeout=30
    )
    assert refused.status_code == 429
    assert "Retry-After" in refused.headers
    assert Request.objects.count() == 3


def test_waiting_limits_and_callers_who_hang_up_while_waiting(served):
    s1, s2 = factories.server("s1"), factories.server("s2")
    factories.deployment(s1, "slow-a", load_s=LONG_LOAD_S)
    factories.deployment(s2, "slow-b", load_s=LONG_LOAD_S)
    live = served(SWITCHYARD_MAX_WAIT_BACKGROUND_S="0.5")

    # 1. Waited past its class's limit: expired, and the waiting caller gets 503.
    expired = httpx.post(
        f"{live.url}/v1/chat/completions",
        headers={"X-Priority": "background"},
        json={"model": "slow-a", **CHAT},
        timeout=30,
    )
    assert expired.status_code == 503
    assert expired.headers["Retry-After"]
    assert expired.json()["error"]["code"] == "expired"
    assert Request.objects.get(model_name="slow-a").state == State.EXPIRED
    assert expired.headers["X-Request-Id"] == str(Request.objects.get(model_name="slow-a").pk)

    # 2. A streaming caller hangs up while its model loads: the request is cancelled.
    with httpx.stream(
        "POST",
        f"{live.url}/v1/chat/completions",
        json={"model": "slow-a", "stream": True, **CHAT},
        timeout=30,
    ) as answer:
        first = next(answer.iter_lines())
    assert first.startswith(": queued as ")
    streamed = Request.objects.get(pk=first.removeprefix(": queued as "))
    assert finished(live, streamed)["state"] == State.CANCELLED

    # 3. A plain caller hangs up while its model loads: cancelled too.
    caller = post_and_keep_open(live, "/v1/chat/completions", {"model": "slow-b", **CHAT})
    live.wait_for_line("loading slow-b on s2")  # stored and routed: it waits for the load
    caller.close()
    plain = Request.objects.get(model_name="slow-b")
    detail = finished(live, plain)
    assert detail["state"] == State.CANCELLED
    assert "disconnected" in detail["trace"][-1]["reason"]

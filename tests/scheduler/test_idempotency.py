"""Idempotency-Key: a retry with the same key gets the same request, its answer or its
stream, and never runs it twice."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from scheduler.api import inference, openai_asgi
from scheduler.models import IdempotencyKey, Request
from tests import factories
from tests.support import asgi
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]


def body(stream: bool = False) -> bytes:
    asked = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return json.dumps(asked).encode()


async def call(raw: bytes, key: str, path: str = "/v1/chat/completions") -> tuple[dict, str]:
    """One POST through the ASGI app: its response headers and whole body."""
    scope = asgi.scope("POST", path, {"Idempotency-Key": key})
    answered = await asgi.call(openai_asgi.app, scope, raw)
    await asyncio.gather(*inference._detached)
    return answered.headers | {"status": answered.status}, answered.body.decode()


@pytest.fixture
def upstream():
    up = Upstream(["m1-upstream"])
    server = factories.server("up", kind="openai", base_url=up.url)
    factories.deployment(server, "m1", server_model_id="m1-upstream", state="loaded")
    yield up
    up.close()


async def test_a_retry_gets_the_same_answer_and_runs_nothing_again(upstream):
    async with Running():
        first, first_body = await call(body(), "k-1")
        again, again_body = await call(body(), "k-1")
    assert first["status"] == again["status"] == 200
    assert again["x-request-id"] == first["x-request-id"]
    assert again["idempotent-replayed"] == "true"
    assert json.loads(again_body) == json.loads(first_body)
    assert len(upstream.received) == 1
    assert await Request.objects.acount() == 1


async def test_a_retried_stream_comes_whole_from_its_start(upstream):
    async with Running():
        first, first_body = await call(body(stream=True), "k-2")
        again, again_body = await call(body(stream=True), "k-2")
    assert again["x-request-id"] == first["x-request-id"]
    assert first_body.endswith("data: [DONE]\n\n") and again_body.endswith("data: [DONE]\n\n")
    events = [e for e in again_body.split("\n\n") if e.startswith("data: {")]
    text = json.loads(events[-1].removeprefix("data: "))["choices"][0]["delta"]["content"]
    first_text = "".join(
        (json.loads(e.removeprefix("data: "))["choices"] or [{}])[0].get("delta", {}).get("content")
        or ""
        for e in first_body.split("\n\n")
        if e.startswith("data: {")
    )
    assert text == first_text
    assert len(upstream.received) == 1


async def test_the_same_key_for_another_kind_of_request_is_refused(upstream):
    async with Running():
        await call(body(), "k-3")
        other = json.dumps({"model": "m1", "prompt": "hi"}).encode()
        refused, refused_body = await call(other, "k-3", "/v1/completions")
    assert refused["status"] == 422
    assert json.loads(refused_body)["error"]["code"] == "idempotency_key_reused"
    assert await Request.objects.acount() == 1


def test_a_job_sent_twice_with_a_key_is_stored_once(upstream):
    client = Client()
    job = {"kind": "chat", "body": json.loads(body())}
    first = client.post(
        "/api/v1/requests", job, content_type="application/json", HTTP_IDEMPOTENCY_KEY="j-1"
    )
    again = client.post(
        "/api/v1/requests", job, content_type="application/json", HTTP_IDEMPOTENCY_KEY="j-1"
    )
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Request.objects.count() == 1 == IdempotencyKey.objects.count()
    other = client.post(
        "/api/v1/requests", job, content_type="application/json", HTTP_IDEMPOTENCY_KEY="j-2"
    )
    assert other.json()["id"] != first.json()["id"]


def test_a_key_too_long_is_a_400_that_stores_nothing(upstream):
    job = {"kind": "chat", "body": json.loads(body())}
    refused = Client().post(
        "/api/v1/requests", job, content_type="application/json", HTTP_IDEMPOTENCY_KEY="x" * 300
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_idempotency_key"
    assert not Request.objects.exists()


async def test_keys_older_than_a_day_are_forgotten(upstream):
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.api import idempotency

    async with Running():
        first, _ = await call(body(), "k-4")
        await IdempotencyKey.objects.aupdate(created_at=timezone.now() - timedelta(hours=25))
        again, _ = await call(body(), "k-4")
    assert again["x-request-id"] != first["x-request-id"]  # a new request under the key
    assert await sync_to_async(idempotency.purge)() == 0  # the old claim gave way already

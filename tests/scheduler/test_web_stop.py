"""A web process that begins to drain (`web_stop`), in its own loop: a long poll answers at
once with the request's state (its caller polls again, at a process that stays up; it held
the drain to its end and was then cut unanswered), and a new call is refused, nothing
stored. The whole process's drain: tests/config/test_web_sigterm.py."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from config.asgi import http
from scheduler.api import web_stop
from scheduler.models import Request
from tests import factories
from tests.support import asgi
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
HOST = {"Host": "127.0.0.1", "Content-Type": "application/json"}


@pytest.fixture
def drains_later(monkeypatch):
    """The module's state back as it was after the test (a process drains once)."""
    monkeypatch.setattr(web_stop, "_draining", False)
    monkeypatch.setattr(web_stop, "_stopping", False)


async def get(path: str, query: str = "") -> asgi.Answered:
    called = asgi.scope("GET", path, HOST, server=("127.0.0.1", 8000), query_string=query.encode())
    return await asgi.call(http, called, b"")


async def test_a_long_poll_answers_when_the_drain_begins(drains_later):
    waiting = await sync_to_async(factories.request)("m1")
    polling = asyncio.create_task(get(f"/api/v1/requests/{waiting.pk}", "wait_s=300"))
    async with asyncio.timeout(10):
        while not web_stop._long_polls:  # its wait has begun (each turn yields to the loop)
            assert not polling.done(), (await polling).body
            await asyncio.sleep(0)

    web_stop.begin_drain()
    async with asyncio.timeout(10):  # it would wait 300 s
        answered = await polling
    assert answered.status == 200, answered.body
    assert json.loads(answered.body)["state"] == "pending"
    assert not web_stop._long_polls


async def test_a_new_call_while_draining_is_refused_and_stores_nothing(drains_later):
    web_stop.begin_drain()
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}).encode()
    answered = await asgi.call(
        http, asgi.scope("POST", "/v1/chat/completions", HOST, server=("127.0.0.1", 8000)), body
    )
    assert answered.status == 503
    assert json.loads(answered.body)["error"]["code"] == "restarting"
    assert answered.headers["connection"] == "close"
    assert not await Request.objects.aexists()
    assert (await get("/healthz")).status == 503  # a load balancer takes it out too

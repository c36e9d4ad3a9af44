"""The bare ASGI app's own duties, driven as daphne drives it: what waits until after the
answer is sent runs even though daphne reports the caller gone the moment it is."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async

from scheduler.api import inference, openai_asgi, recovery
from scheduler.api.inbox import inbox
from scheduler.api.inference import Reply
from scheduler.models import Request, State
from tests import factories
from tests.support import asgi
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

BODY = b'{"model": "m1", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.fixture
def answered(monkeypatch):
    """`answer` replaced: a 200 whose `then` records when it ran (and what was sent by then)."""
    ran: list[list[dict]] = []
    sent: list[dict] = []

    async def then() -> None:
        await asyncio.sleep(0)  # a round trip of its own: cancellable, were it in the request
        ran.append(list(sent))

    async def answer(kind, raw, priority, api_key=None, idempotency_key=None, progress=None):
        return Reply(200, {}, {"ok": True}, then=then)

    monkeypatch.setattr(openai_asgi, "answer", answer)
    return sent, ran


async def drive(sent: list[dict], send_fails: bool = False) -> None:
    """One POST through the app; daphne's `http.disconnect` as soon as the body is sent."""
    scope = asgi.scope("POST", "/v1/chat/completions")
    await asgi.call(openai_asgi.app, scope, BODY, sent, send_fails)
    await asyncio.gather(*inference._detached)


async def test_what_follows_an_answer_runs_after_it_is_sent(answered):
    sent, ran = answered
    await drive(sent)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert ran == [sent]  # after the whole answer, though the caller was then reported gone


async def test_what_follows_an_answer_runs_when_sending_it_fails(answered):
    sent, ran = answered
    with pytest.raises(OSError):
        await drive(sent, send_fails=True)
    await asyncio.gather(*inference._detached)
    assert ran == [[]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_thread_closed")
async def test_a_callers_subscription_ends_once_it_is_answered():
    """Through the real `answer`, the channel layer and an in-process worker."""
    upstream = Upstream(["m1-upstream"])
    try:
        await sync_to_async(deployed)(upstream.url)
        sent: list[dict] = []
        async with Running():
            await drive(sent)
        assert sent[0]["status"] == 200
        assert json.loads(sent[1]["body"])["choices"][0]["message"]["content"]
        assert not inbox().queues  # no one listens for that request any more
    finally:
        upstream.close()


def deployed(url: str) -> None:
    server = factories.server("up", kind="openai", base_url=url)
    factories.deployment(server, "m1", server_model_id="m1-upstream", state="loaded")


@pytest.mark.django_db(transaction=True)
async def test_a_caller_that_hangs_up_while_its_request_is_stored_cancels_it(monkeypatch):
    """The store runs on in its thread after the caller is gone: the request it stores is
    then cancelled, not left waiting with nobody to read its answer. Breaks if the hang-up
    only cancels requests already stored when it came."""
    await sync_to_async(factories.deployment)(await sync_to_async(factories.server)("s1"), "m1")
    entered, release = threading.Event(), threading.Event()
    store = recovery.accept

    def held(*args, **kwargs):
        entered.set()
        release.wait(30)
        return store(*args, **kwargs)

    monkeypatch.setattr(recovery, "accept", held)
    incoming = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict:
        if incoming:
            return incoming.pop()
        await asyncio.to_thread(entered.wait, 30)  # the store has begun: the caller goes
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        raise AssertionError(f"nobody is left to answer: {message}")

    await openai_asgi.app(asgi.scope("POST", "/v1/chat/completions"), receive, send)
    release.set()  # the caller is gone; now the store ends
    await asyncio.gather(*inference._detached)
    [request] = await sync_to_async(list)(Request.objects.all())
    assert request.state == State.CANCELLED

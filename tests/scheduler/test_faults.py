"""Faults at the edges, in process: a stream that fails after its status still ends with
an error event and [DONE]; a store whose connection died is stored once; chunks lost with
Redis come with the end; an outage is logged once down and once back."""

import asyncio
import json
import logging

import psycopg
import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

from scheduler import faults
from scheduler.api import openai_asgi, recovery
from scheduler.api.inference import Reply, relay_sse
from scheduler.api.waiting import Subscription
from scheduler.channel_hints import request_group
from scheduler.models import Request, State
from scheduler.streams import CatchUp
from tests import factories

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_stream_that_fails_midway_ends_with_an_error_event_and_done():
    async def events():
        yield ": queued as r1\n\n"
        yield 'data: {"choices": []}\n\n'
        raise psycopg.OperationalError("the database went away")

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    reply = Reply(200, {"X-Request-Id": "r1"}, events=events())
    await openai_asgi.send_reply(send, reply)
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    error_event, done = body.split("\n\n")[-3:-1]
    assert json.loads(error_event.removeprefix("data: "))["error"]["code"] == "unavailable"
    assert done == "data: [DONE]"
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


RESULT = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m1",
    "choices": [{"message": {"content": "Hello, world"}, "finish_reason": "stop"}],
}


def sent(text: str, at: int, n: int) -> dict:
    """A worker's message: a chunk of `text`, where it begins, its number in its run."""
    return {"chunks": [chunk(text)], "at": at, "n": n}


def test_the_text_a_caller_never_saw_comes_as_one_chunk():
    relayed = CatchUp()
    assert relayed.relay(sent("Hello", 0, 0))
    assert not relayed.relay(sent(" world", 7, 2))  # ", " (message 1) was lost
    assert not relayed.relay(sent("!", 12, 3))  # nothing live after a gap
    [missed] = relayed.ending(RESULT, "r1")
    assert missed["choices"] == [
        {"index": 0, "finish_reason": "stop", "delta": {"content": ", world"}}
    ]


def test_a_second_run_is_not_relayed_twice():
    relayed = CatchUp()
    assert relayed.relay(sent("Hello", 0, 0))
    assert not relayed.relay(sent("Hello", 0, 0))  # another worker's run
    assert relayed.ending(RESULT, "r1")[0]["choices"][0]["delta"] == {"content": ", world"}
    other = {"choices": [{"message": {"content": "Goodbye"}, "finish_reason": "stop"}]}
    assert relayed.ending(other, "r1")[0]["error"]["code"] == "stream_diverged"
    assert CatchUp().ending(RESULT, "r1") != []


def test_a_second_run_that_says_the_same_goes_on_live_from_where_the_caller_is():
    """A worker's process exited mid-answer; another runs the request again from the start.
    Its text is followed unseen until it passes what the caller saw; the rest is live."""
    relayed = CatchUp()
    relayed.relay(sent("Hello", 0, 0))
    role = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    assert relayed.relay({"chunks": [role], "at": 0, "n": 0}) == []
    assert relayed.relay(sent("Hel", 0, 1)) == []
    [rest] = relayed.relay(sent("lo, w", 3, 2))
    assert rest == chunk(", w")
    assert relayed.relay(sent("orld", 8, 3)) == [chunk("orld")]
    assert (relayed.text, relayed.diverged) == ("Hello, world", False)
    assert relayed.ending(RESULT, "r1") == []  # nothing left to send at the end


def test_a_second_run_goes_on_under_the_first_runs_chunk_id():
    relayed = CatchUp()
    first, second = {"id": "chatcmpl-1", "created": 100}, {"id": "chatcmpl-2", "created": 160}
    relayed.relay({"chunks": [chunk("Hello") | first], "at": 0, "n": 0})
    relayed.relay({"chunks": [chunk("Hello") | second], "at": 0, "n": 0})
    [went_on] = relayed.relay({"chunks": [chunk(", w") | second], "at": 5, "n": 1})
    assert (went_on["id"], went_on["created"]) == ("chatcmpl-1", 100)
    [end] = relayed.ending(RESULT | {"created": 170}, "r1")  # the stored answer's is c1
    assert (end["id"], end["created"]) == ("chatcmpl-1", 100)


def test_a_second_run_that_says_otherwise_is_known_at_once():
    relayed = CatchUp()
    relayed.relay(sent("Hello", 0, 0))
    assert relayed.relay(sent("Help", 0, 0)) == []
    assert relayed.diverged
    assert relayed.relay(sent(" me", 4, 1)) == []  # nothing after it


def test_a_second_run_that_loses_a_message_waits_for_the_end():
    relayed = CatchUp()
    relayed.relay(sent("Hello", 0, 0))
    relayed.relay(sent("He", 0, 0))
    assert relayed.relay(sent(", world", 5, 2)) == []  # "llo" (message 1) was lost
    assert not relayed.diverged
    assert relayed.ending(RESULT, "r1")[0]["choices"][0]["delta"] == {"content": ", world"}


def test_a_second_run_goes_on_after_the_events_the_caller_saw_past_the_text():
    """The caller saw the text and its finish; the second run's finish is not sent again,
    its usage (the chunk after) is."""
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {"choices": [], "usage": {"completion_tokens": 2}}
    relayed = CatchUp()
    relayed.relay({"chunks": [chunk("Hello"), finish], "at": 0, "n": 0})
    assert relayed.relay({"chunks": [chunk("Hel"), chunk("lo"), finish], "at": 0, "n": 0}) == []
    assert relayed.relay({"chunks": [usage], "at": 5, "n": 1}) == [usage]


def test_a_caller_that_joined_late_follows_a_run_begun_again_from_its_start():
    relayed = CatchUp()
    relayed.live = False  # an Idempotency-Key replay of a stream under way
    assert relayed.relay(sent("Hello", 0, 4)) == []
    assert relayed.relay(sent("Hel", 0, 0)) == [chunk("Hel")]  # another worker's run
    assert relayed.relay(sent("lo", 3, 1)) == [chunk("lo")]


@pytest.fixture
async def streaming():
    """A caller streaming a request at a server, and what its worker publishes."""
    r = await sync_to_async(factories.request)("m1", state=State.PROCESSING, stream=True)
    sub = await Subscription(r.pk).open()
    events = relay_sse(sub, known=r)
    assert (await anext(events)).startswith(": queued as")

    async def written(text: str, at: int, n: int) -> None:
        message = {"type": "stream.chunk", "id": str(r.pk)} | sent(text, at, n)
        await get_channel_layer().group_send(request_group(r.pk), message)

    yield r, events, written
    await events.aclose()


@pytest.mark.django_db(transaction=True)
async def test_a_stream_run_again_goes_on_live(streaming):
    _, events, written = streaming
    await written("Hello", 0, 0)
    assert '"Hello"' in await anext(events)
    await written("Hel", 0, 0)  # its worker's process exited; another runs it again
    await written("lo, w", 3, 1)
    assert '{"content": ", w"}' in await anext(events)


@pytest.mark.django_db(transaction=True)
async def test_a_stream_run_again_that_says_otherwise_ends_at_once_and_runs_on(streaming):
    r, events, written = streaming
    await written("Hello", 0, 0)
    await anext(events)
    await written("Help", 0, 0)
    error, done = await anext(events), await anext(events)
    assert '"code": "stream_diverged"' in error and done == "data: [DONE]\n\n"
    with pytest.raises(StopAsyncIteration):
        await anext(events)
    await r.arefresh_from_db()
    assert r.state == State.PROCESSING  # not cancelled: its answer is kept for GET


def test_an_outage_is_logged_once_down_and_once_back(caplog):
    outage = faults.Outage("Redis")
    with caplog.at_level(logging.INFO, logger="scheduler.faults"):
        for _ in range(5):
            outage.failed(ConnectionError("refused"), "sending a hint")
        for _ in range(3):
            outage.works()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "Redis is down",
        "Redis is back",
    ]


def kill_own_backend() -> None:
    """End this thread's database session from outside, as a restart does."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"] or "127.0.0.1", port=db["PORT"]
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.django_db(transaction=True)
def test_a_store_on_a_dead_connection_is_stored_once(caplog):
    if connection.vendor != "postgresql":
        pytest.skip("terminates a PostgreSQL backend")
    server = factories.server("up")
    factories.deployment(server, "m1", state="loaded")
    kill_own_backend()
    request = recovery.accept("chat", BODY)
    assert Request.objects.filter(pk=request.pk).count() == 1
    assert Request.objects.count() == 1
    assert "hit a database fault" in caplog.text  # the first insert did meet the dead one


@pytest.mark.django_db(transaction=True)
def test_no_connection_to_be_had_is_a_503_that_stored_nothing(monkeypatch):
    def refuse() -> None:
        raise faults.OperationalError("connection refused")

    connection.close()  # none open, as after a restart: and none to be had
    monkeypatch.setattr(connection, "ensure_connection", refuse)
    with pytest.raises(recovery.ApiError) as refused:
        recovery.accept("chat", BODY)
    assert (refused.value.status, refused.value.code) == (503, "unavailable")
    assert refused.value.headers() == {"Retry-After": "1"}
    monkeypatch.undo()
    assert not Request.objects.exists()


async def test_waiters_reread_often_while_redis_is_down(monkeypatch):
    from scheduler.api.waiting import DEGRADED_EVERY_S, Subscription

    sub = Subscription()
    sub.queue = asyncio.Queue()
    monkeypatch.setattr(faults.REDIS, "down", True)
    ticks = sub.messages(every_s=60)
    async with asyncio.timeout(DEGRADED_EVERY_S * 4):
        assert await anext(ticks) is None  # a re-read within the degraded interval


async def test_a_waiter_re_reads_at_once_when_redis_fails_its_reader(monkeypatch):
    """Not after the silence it was waiting out (its next SSE comment): its end may have
    been hinted to a Redis that is gone."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from scheduler.api.waiting import Subscription

    monkeypatch.setattr(faults.REDIS, "down", False)  # restored after the outage below
    sub = Subscription()
    sub.queue = asyncio.Queue()
    sub.inbox.queues[str(sub.request_id)].add(sub.queue)

    async def read() -> None:
        raise RedisConnectionError("Redis went away")

    ticks = sub.messages(every_s=60)
    reader = sub.inbox.read_forever(read)
    try:
        async with asyncio.timeout(5):  # a guard: the silence waited out would be 60 s
            assert await anext(ticks) is None  # re-read now
    finally:
        reader.cancel()
        sub.inbox.queues.pop(str(sub.request_id))
    assert faults.REDIS.down

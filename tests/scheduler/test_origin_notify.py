"""On PostgreSQL the transaction that ends a request NOTIFYs the web process that made its
id, so that a waiting caller hears of the end with the commit itself; and that process's
inbox hands it to the caller. Nothing is told of an end that was not made, nor of a
streamed request's (its end must follow its chunks, which go by the channel layer)."""

import asyncio
import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from backends.models import Deployment, DeploymentState
from scheduler import sql, store, wakeup
from scheduler.api import intake
from scheduler.api.waiting import Subscription
from scheduler.decisions import Route
from scheduler.runtime.execution import Home, transition_for
from scheduler.transitions import MAX_NOTIFY_PAYLOAD
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.skipif(not settings.IS_POSTGRES, reason="LISTEN/NOTIFY needs PostgreSQL"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("db_thread_closed"),
]
db = sync_to_async
ORIGIN = "0a1b2c3d"  # a web process's tag


def an_id() -> uuid.UUID:
    return uuid.UUID(uuid.uuid4().hex[: 32 - len(ORIGIN)] + ORIGIN)


def loaded() -> tuple[Deployment, int]:
    """A deployment of m1 loaded with room, and a worker to send to it."""
    d = factories.deployment(factories.server("s1", slots=4), "m1", state=DeploymentState.LOADED)
    return d, store.register_worker()


def sent(to: tuple[Deployment, int], stream: bool = False) -> store.ServeJob:
    """A request of this origin's, stored and sent."""
    d, worker_id = to
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    request = intake.accept("chat", body, request_id=an_id(), caller_waits=True)
    home = {d.pk: Home(d.server_id, d.server.name)}
    route = transition_for(Route(request.pk, d.pk, True, "sent on arrival"), home)
    [job] = store.send_on_arrival([route], [(request.pk, d.pk)], worker_id)
    assert job is not None
    return job


class Listening:
    """What this origin's channel hears, from a LISTEN of its own."""

    async def __aenter__(self) -> asyncio.Queue:
        self.heard: asyncio.Queue[str | None] = asyncio.Queue()
        channel = wakeup.origin_channel(an_id())
        self.task = asyncio.create_task(wakeup.listen(channel, self.heard.put_nowait))
        assert await asyncio.wait_for(self.heard.get(), 10) is None  # listening
        return self.heard

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def notify(channel: str, payload: str) -> None:
    sql.execute("SELECT pg_notify(%s, %s)", [channel, payload])


async def test_the_end_of_a_request_is_notified_to_the_process_that_made_its_id():
    async with Listening() as heard:
        job = await db(sent)(await db(loaded)())
        answer = {"choices": [{"message": {"content": "it's done"}}]}
        await db(store.requests_completed)([store.Answer(job, answer, 0.1)])

        told = json.loads(await asyncio.wait_for(heard.get(), 10))
        assert told == {
            "type": "request.moved",
            "id": str(job.request_id),
            "state": "completed",
            "outcome": {"result": answer},
        }


async def test_an_end_not_made_and_a_streamed_end_are_not_notified():
    async with Listening() as heard:
        to = await db(loaded)()
        job = await db(sent)(to)
        streamed = await db(sent)(to, stream=True)
        await db(store.requests_completed)([store.Answer(job, {"ok": 1}, 0.1)])
        assert json.loads(await asyncio.wait_for(heard.get(), 10))["id"] == str(job.request_id)

        # Its second end is refused (it ended already); the streamed one is made.
        made = await db(store.requests_completed)(
            [store.Answer(job, {"ok": 2}, 0.1), store.Answer(streamed, {"ok": 3}, 0.1)]
        )
        assert made == [False, True]
        # A NOTIFY of our own after them: whatever they sent would have come before it.
        await db(notify)(wakeup.origin_channel(an_id()), "mark")
        assert await asyncio.wait_for(heard.get(), 10) == "mark"


async def test_an_answer_too_large_for_a_notify_goes_without_it():
    async with Listening() as heard:
        job = await db(sent)(await db(loaded)())
        answer = {"content": "x" * MAX_NOTIFY_PAYLOAD}
        await db(store.requests_completed)([store.Answer(job, answer, 0.1)])

        told = json.loads(await asyncio.wait_for(heard.get(), 10))
        assert told == {"type": "request.moved", "id": str(job.request_id), "state": "completed"}


async def test_the_inbox_hands_a_notified_end_to_the_caller_waiting_for_it():
    """Through this loop's inbox, whose ids carry its own tag: no channel layer involved."""
    sub = await Subscription().open()
    try:
        message = {"type": "request.moved", "id": str(sub.request_id), "state": "completed"}
        channel = wakeup.origin_channel(sub.request_id)
        await db(notify)(channel, json.dumps(message))
        assert await asyncio.wait_for(sub.queue.get(), 10) == message
    finally:
        await sub.close()


async def test_one_process_ids_share_their_end_not_their_start():
    """The tag that routes a request's end to its web process is the id's last 8 hex
    digits: ids shortened to their start, as the dashboard and people do, still differ."""
    subs = [Subscription() for _ in range(20)]
    ids = [sub.request_id.hex for sub in subs]
    assert len({i[-8:] for i in ids}) == 1 and len({i[:8] for i in ids}) == 20
    assert wakeup.origin_channel(subs[0].request_id).endswith(ids[0][-8:])


async def test_a_listen_that_loses_its_connection_listens_again():
    """The web's inbox and the worker listen alike (`wakeup.listen`): a LISTEN whose
    connection is ended comes back, says so (None: what came meanwhile was missed), and
    hears what is sent after."""
    channel = wakeup.origin_channel(an_id())
    async with Listening() as heard:
        ended = await db(sql.fetch)(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            [f"LISTEN {channel}"],
        )
        assert ended == [(1,)]
        assert await asyncio.wait_for(heard.get(), 10) is None  # listening again
        await db(notify)(channel, "after")
        assert await asyncio.wait_for(heard.get(), 10) == "after"

"""The dashboard's websockets through the real ASGI application and channel layer."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from config.asgi import application
from scheduler.models import State
from scheduler.throttle import Throttle
from scheduler.transitions import move
from tests import factories

db = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


def session_cookie(**user_fields) -> tuple[bytes, bytes]:
    user = User.objects.create(username="someone", **user_fields)
    client = Client()
    client.force_login(user)
    return b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()


@pytest.fixture
def staff_cookie():
    return session_cookie(is_staff=True)


def communicator(path: str, *headers) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])


async def receive_until(ws: WebsocketCommunicator, matches) -> dict:
    """Messages carry full state; other hints may come first (the channel layer is shared)."""
    while True:
        message = await ws.receive_json_from(timeout=10)
        if matches(message["state"]):
            return message


@db
@pytest.mark.parametrize("cookie", [None, {"is_staff": False}])
async def test_anonymous_and_non_staff_are_refused(cookie):
    headers = [] if cookie is None else [await sync_to_async(session_cookie)(**cookie)]
    for path in ("/ws/dashboard/", "/ws/requests/00000000-0000-0000-0000-000000000000/"):
        ws = communicator(path, *headers)
        connected, code = await ws.connect(timeout=10)
        assert not connected
        assert code == 4403
        await ws.disconnect()


@db
async def test_a_transition_after_connect_arrives_as_full_state(staff_cookie):
    request = await sync_to_async(factories.request)("m")
    ws = communicator("/ws/dashboard/", staff_cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    first = await ws.receive_json_from(timeout=10)
    assert first["type"] == "overview"
    assert [r["state"] for r in first["state"]["waiting"]] == ["pending"]

    await sync_to_async(move)(request.pk, [State.PENDING], State.CANCELLED, "caller gave up")

    message = await receive_until(ws, lambda s: not s["waiting"])
    assert message["type"] == "overview"
    assert message["state"]["waiting_total"] == 0
    assert [(r["id"], r["state"]) for r in message["state"]["recent"]] == [
        (str(request.pk), "cancelled")
    ]
    assert {"servers", "running", "at"} <= message["state"].keys()
    await ws.disconnect()


@db
async def test_a_request_page_follows_its_request(staff_cookie):
    request = await sync_to_async(factories.request)("m")
    ws = communicator(f"/ws/requests/{request.pk}/", staff_cookie)
    assert (await ws.connect(timeout=10))[0]
    first = await ws.receive_json_from(timeout=10)
    assert (first["type"], first["state"]["state"], first["state"]["position"]) == (
        "request",
        "pending",
        1,
    )

    await sync_to_async(move)(request.pk, [State.PENDING], State.CANCELLED, "caller gave up")

    message = await receive_until(ws, lambda s: s["state"] == "cancelled")
    assert message["state"]["position"] is None
    assert [t["reason"] for t in message["state"]["trace"]] == ["caller gave up"]
    await ws.disconnect()


async def test_a_burst_of_hints_is_one_more_read_of_the_final_state():
    """Hints that arrive while a push runs fold into one push after it, which sees the last
    change. No clock involved (interval 0): the test holds the first push open."""
    truth = {"value": 0}
    seen: list[int] = []
    pushing, release = asyncio.Event(), asyncio.Event()

    async def push() -> None:
        seen.append(truth["value"])  # the read
        pushing.set()
        await release.wait()  # the send, held open

    throttle = Throttle(push, interval_s=0)
    throttle.hint()
    await pushing.wait()
    for value in range(1, 21):
        truth["value"] = value
        throttle.hint()
    release.set()
    await throttle.task
    assert seen == [0, 20]


def test_pages_in_one_process_share_a_fresh_read_until_the_next_hint():
    from dashboard.consumers import SharedRead

    reads = []
    shared = SharedRead(lambda: reads.append(1) or len(reads))
    shared.hinted()
    assert [shared.get() for _ in range(20)] == [1] * 20  # twenty pages, one read
    shared.hinted()
    assert shared.get() == 2  # something moved since: read again
    shared.started -= 1  # a read older than max_age_s is not handed out
    assert shared.get() == 3


@db
async def test_a_worker_that_dies_quietly_reaches_an_open_dashboard(staff_cookie, monkeypatch):
    """A dead worker sends no news: the page's process looks at the workers every few
    seconds while a dashboard is open, and a change of who is live hints the pages."""
    from dashboard.consumers import WorkerWatch
    from scheduler.models import Worker

    monkeypatch.setattr(WorkerWatch, "every_s", 0.05)
    worker = await Worker.objects.acreate(host="gpu-host", pid=1)
    ws = communicator("/ws/dashboard/", staff_cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    await receive_until(ws, lambda s: s["workers"]["live"] == 1)

    long_ago = worker.last_heartbeat.replace(year=2000)
    await Worker.objects.filter(pk=worker.pk).aupdate(last_heartbeat=long_ago)
    seen = await receive_until(ws, lambda s: s["workers"]["live"] == 0)
    assert seen["state"]["workers"]["last_heartbeat"].startswith("2000-")
    await ws.disconnect()

"""The watch page: a request's signed URL, no login; its state without the prompt; its
stream relayed live; refused without a valid token."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from access.models import ApiKey
from config.asgi import application
from dashboard.watch_tokens import request_id_for, token_for
from scheduler.api.inference import relay_sse
from scheduler.api.waiting import Subscription
from scheduler.channel_hints import request_group
from scheduler.models import State
from tests import factories

ORIGIN = (b"origin", b"http://127.0.0.1")


def test_a_token_names_its_request_and_nothing_else_does():
    request_id = "8f14e45f-ceea-467f-a8f7-5f1e3c7c2c3a"
    assert str(request_id_for(token_for(request_id))) == request_id
    assert request_id_for(token_for(request_id) + "x") is None
    assert request_id_for("not-a-token") is None


@pytest.mark.django_db
def test_the_page_shows_place_and_no_prompt_to_anyone_with_the_link(client):
    key, _ = ApiKey.generate("acme-internal-app")
    key.save()
    r = factories.request("m", api_key=key)
    r.payload = {"model": "m", "messages": [{"role": "user", "content": "my secret question"}]}
    r.save()
    response = client.get(f"/watch/{token_for(r.pk)}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "my secret question" not in page
    body = client.get(f"/watch/{token_for(r.pk)}/state.json").json()
    assert (body["state"], body["position"], body["waiting_total"]) == ("pending", 1, 1)
    assert "payload" not in body and "server" not in body
    assert "caller" not in body and "acme-internal-app" not in page  # the staff's page only
    assert client.get("/watch/forged/").status_code == 404
    assert client.get(f"/watch/{token_for(r.pk)}x/state.json").status_code == 404


@pytest.mark.django_db(transaction=True)
async def test_the_watch_socket_sends_state_then_the_stream_as_it_comes():
    r = await sync_to_async(factories.request)("m", state=State.PROCESSING)
    ws = WebsocketCommunicator(application, f"/ws/watch/{token_for(r.pk)}/", headers=[ORIGIN])
    connected, _ = await ws.connect(timeout=10)
    assert connected
    first = await ws.receive_json_from(timeout=10)
    assert (first["type"], first["state"]["state"]) == ("watch", "processing")
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hello"}}]}
    await get_channel_layer().group_send(
        request_group(r.pk), {"type": "stream.chunk", "id": str(r.pk), "chunks": [chunk, chunk]}
    )
    while True:
        message = await ws.receive_json_from(timeout=10)
        if message["type"] == "chunk":
            break
    assert message["text"] == "HelloHello"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_forged_watch_socket_is_refused():
    ws = WebsocketCommunicator(application, "/ws/watch/forged/", headers=[ORIGIN])
    connected, code = await ws.connect(timeout=10)
    assert (connected, code) == (False, 4404)
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_socket_opened_mid_answer_gets_its_start_from_the_callers_relay():
    """The streamed text is kept on the row only at the end; the caller's relay holds what
    was written so far, and answers the page that asks for it (its channel alone), each
    piece marked with where it begins in the answer."""
    r = await sync_to_async(factories.request)("m", state=State.PROCESSING, stream=True)
    layer, group = get_channel_layer(), request_group(r.pk)
    sub = await Subscription(r.pk).open()
    caller: asyncio.Queue[str] = asyncio.Queue()
    relaying = asyncio.create_task(collect(relay_sse(sub, known=r, hang_up_cancels=False), caller))

    def written(text: str, at: int) -> dict:
        chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
        return {"type": "stream.chunk", "id": str(r.pk), "chunks": [chunk], "at": at}

    await layer.group_send(group, written("Once upon ", 0))
    while "Once upon" not in await caller.get():  # the caller has it
        pass
    ws = WebsocketCommunicator(application, f"/ws/watch/{token_for(r.pk)}/", headers=[ORIGIN])
    assert (await ws.connect(timeout=10))[0]
    await layer.group_send(group, written("a time", 10))

    pieces = []
    while len(pieces) < 2:
        message = await ws.receive_json_from(timeout=10)
        if message["type"] == "chunk":
            pieces.append((message["text"], message["at"]))
    assert sorted(pieces, key=lambda p: p[1]) == [("Once upon ", 0), ("a time", 10)]
    await ws.disconnect()
    relaying.cancel()
    await asyncio.gather(relaying, return_exceptions=True)


async def collect(events, into: asyncio.Queue[str]) -> None:
    async for event in events:
        into.put_nowait(event)

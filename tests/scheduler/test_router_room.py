"""A llama-server router that runs fewer models at once (`--models-max`) than Switchyard
may keep there stops models behind its back, and refuses loads while all it runs are busy:
the worker says so in its log, once, as it first reaches it (`check_servers` says the same,
if an operator runs it)."""

import logging

import pytest
from asgiref.sync import sync_to_async

from tests import factories
from tests.support.replay_server import ReplayServer, Reply
from tests.support.running import db_thread_closed, status_syncs  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]

LISTING = {
    "object": "list",
    "data": [
        {"id": model, "object": "model", "status": {"value": "unloaded"}}
        for model in ("llm", "embed")
    ],
}


def router_with_two_types(url: str):
    """One LLM room and one for embedding models, as Switchyard sees the server."""
    server = factories.server("router", kind="llamacpp", base_url=url)
    factories.deployment(server, "llm")
    factories.model("embed", type="embedding")
    factories.deployment(server, "embed")
    return server


@pytest.mark.parametrize("room, warned", [(1, True), (2, False), (None, False)])
async def test_a_router_with_less_room_than_switchyard_keeps_there_is_named_once(
    caplog, room, warned
):
    caplog.set_level(logging.WARNING, logger="scheduler")
    with ReplayServer() as router:
        router.on("GET", "/v1/models", Reply(200, LISTING))
        props = {"role": "router", **({"max_instances": room} if room else {})}
        router.on("GET", "/props", Reply(200, props))
        server = await sync_to_async(router_with_two_types)(router.url)
        await status_syncs(server.pk)
        assert len([s for s in router.seen if s.path == "/props"]) == 1

    said = [r.getMessage() for r in caplog.records]
    expected = (
        "server router: the router runs at most 1 model at once (--models-max) and stops the"
        " least recently used by itself beyond that, but Switchyard may keep 2 there (max"
        " LLMs and the room for each other type deployed): lower them to 1 in all, or start"
        " the router with --models-max 2 (0: no limit)"
    )
    assert said == ([expected] if warned else [])

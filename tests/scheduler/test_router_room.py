"""A llama-server router runs at most `--models-max` models at once, of every type alike,
and stops the least recently used by itself beyond that (refusing loads while all it runs
are busy). A worker learns that room as it reaches the router, and again after a failure (a
restart may change it): the server's `max_models`, which the policy then keeps to."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.models import Server
from scheduler.runtime import Runtime
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


def router_with_two_types(url: str, **fields) -> Server:
    """One LLM room and one for embedding models, as Switchyard sees the server."""
    server = factories.server("router", kind="llamacpp", base_url=url, **fields)
    factories.deployment(server, "llm")
    factories.model("embed", type="embedding")
    factories.deployment(server, "embed")
    return server


def answering(router: ReplayServer, room: int | None) -> None:
    router.on("GET", "/v1/models", Reply(200, LISTING))
    props = {"role": "router", **({"max_instances": room} if room else {})}
    router.on("GET", "/props", Reply(200, props))


@pytest.mark.parametrize("room", [1, 2, 4])
async def test_a_worker_learns_the_routers_room_once(caplog, room):
    caplog.set_level(logging.INFO, logger="scheduler")
    with ReplayServer() as router:
        answering(router, room)
        server = await sync_to_async(router_with_two_types)(router.url)
        await status_syncs(server.pk)
        assert len([s for s in router.seen if s.path == "/props"]) == 1

    await server.arefresh_from_db()
    assert server.max_models == room
    said = [r.getMessage() for r in caplog.records if "--models-max" in r.getMessage()]
    plural = "model" if room == 1 else "models"
    assert said == [
        f"server router runs at most {room} {plural} at once (--models-max): Switchyard now"
        f" keeps at most {room} there in all (max models in all, was empty)"
    ]


async def test_a_router_with_no_limit_or_a_lower_count_set_is_left_as_it_is(caplog):
    caplog.set_level(logging.INFO, logger="scheduler")
    for room, kept in ((None, None), (4, 1)):
        with ReplayServer() as router:
            answering(router, room)
            server = await sync_to_async(router_with_two_types)(router.url, max_models=kept)
            await status_syncs(server.pk, times=1)
        await server.arefresh_from_db()
        assert server.max_models == kept  # an operator's lower count stays
        await server.adelete()
    assert not [r for r in caplog.records if "--models-max" in r.getMessage()]


async def test_a_router_back_from_a_failure_is_asked_its_room_again():
    """Restarted with another --models-max: the same worker learns the lower room at the
    router's next answer (asked once while it stays up)."""
    runtime = Runtime()
    try:
        with ReplayServer() as router:
            answering(router, 2)
            server = await sync_to_async(router_with_two_types)(router.url)
            await runtime.server_tasks.sync_server(server.pk)
            router.on("GET", "/v1/models", Reply(503, {"error": "restarting"}))
            await runtime.server_tasks.sync_server(server.pk)
            answering(router, 1)
            await runtime.server_tasks.sync_server(server.pk)
            await runtime.server_tasks.sync_server(server.pk)
            assert len([s for s in router.seen if s.path == "/props"]) == 2
    finally:
        await runtime.effects.close_adapters()

    await server.arefresh_from_db()
    assert server.max_models == 1

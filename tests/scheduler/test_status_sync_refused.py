"""A server that answers, but not with its model list (another kind of server, or a web
page at its address): the worker's status sync says so in its log, once, and marks nothing
(its loads will say the rest). And one deleted before its sync or probe asks."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.models import Health, Server
from scheduler.runtime import Runtime
from tests import factories
from tests.backends.test_checkup import ERROR_PAGE
from tests.support.replay_server import ReplayServer, Reply
from tests.support.running import db_thread_closed, status_syncs  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]


async def test_a_refused_model_list_is_said_once_and_marks_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="scheduler")
    with ReplayServer() as web:
        web.on("GET", "/api/tags", Reply(404, ERROR_PAGE, {"Content-Type": "text/html"}))
        server = await sync_to_async(factories.server)("web", kind="ollama", base_url=web.url)
        await status_syncs(server.pk)
        assert len([s for s in web.seen if s.path == "/api/tags"]) == 3

    said = [r.getMessage() for r in caplog.records if "model list" in r.getMessage()]
    assert said == [
        "server web answers, but not with its model list (not_found: Error response Error"
        " code: 404 Message: File not found.): is it a server of its kind at that address?"
        " `manage.py check_servers web` says what answers there"
    ]
    assert (await Server.objects.aget(pk=server.pk)).health == Health.UP


async def test_a_sync_or_probe_of_a_server_deleted_since_is_quiet(caplog):
    """A pass plans a probe or a sync, and the operator deletes the server before the task
    asks for its adapter: the task ends without a word (it crashed the worker)."""
    caplog.set_level(logging.WARNING, logger="scheduler")
    server = await sync_to_async(factories.server)("gone", kind="ollama", base_url="http://x")
    await server.adelete()
    runtime = Runtime()
    await runtime.server_tasks.sync_server(server.pk)
    await runtime.server_tasks.probe(server.pk)
    assert caplog.records == []

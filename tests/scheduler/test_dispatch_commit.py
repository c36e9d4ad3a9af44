"""A call to a server cannot be taken back: it waits for its dispatch's commit.

On PostgreSQL, the worker's backend is terminated at the worst moment: the dispatch holds
its locks and has handed its job over, so a call that started then would reach the server
while the commit fails and leaves the request to be sent again (the fault suite's
"run 2 times in 1 attempts")."""

import asyncio
import threading

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connection
from django.db.utils import OperationalError

from backends.models import DeploymentState
from scheduler import store
from scheduler.models import Request, State
from scheduler.runtime import Runtime, ServerTasks
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("db_thread_closed"),
    pytest.mark.skipif(not settings.IS_POSTGRES, reason="terminates a PostgreSQL backend"),
]
db = sync_to_async
GUARD_S = 10  # bounds a broken test only


class WatchedCommit:
    """A dispatch's commit event that tells `decided` when a call waits for it."""

    def __init__(self, event: asyncio.Event, decided: threading.Event) -> None:
        self.event, self.decided = event, decided

    def is_set(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> bool:
        self.decided.set()
        return await self.event.wait()


def terminate(pid: int) -> None:
    """End the backend and wait until it is gone (PostgreSQL 14's timeout)."""
    params = settings.DATABASES["default"]
    with psycopg.connect(
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        user=params["USER"],
        password=params["PASSWORD"] or None,
        dbname=connection.settings_dict["NAME"],
        autocommit=True,
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, %s)", (pid, GUARD_S * 1000))


def setup(url: str) -> Request:
    server = factories.server("up", kind="openai", base_url=url, slots=1)
    factories.deployment(server, "m1", state=DeploymentState.LOADED)
    return factories.request("m1")


async def test_a_dispatch_whose_backend_is_terminated_before_its_commit_called_nobody(
    monkeypatch,
):
    upstream = Upstream(["m1"])
    decided = threading.Event()  # the call reached the server, or waits for the commit
    upstream.arrived = decided
    real_dispatch, real_serve = store.dispatch_all, ServerTasks.serve

    def dispatch_all(sends, worker_id, routes=None, send_now=None):
        def send_then_lose_the_backend(jobs):
            send_now(jobs)
            assert decided.wait(GUARD_S)
            terminate(connection.connection.info.backend_pid)

        return real_dispatch(sends, worker_id, routes, send_then_lose_the_backend)

    async def serve(self, job, committed):
        return await real_serve(self, job, WatchedCommit(committed, decided))

    try:
        request = await db(setup)(upstream.url)
        rt = Runtime()
        await rt.start()
        server_id = await db(lambda: request.model.deployments.get().server_id)()
        await rt.effects.adapter(server_id)  # built before: the database thread is held meanwhile
        monkeypatch.setattr(store.dispatch, "dispatch_all", dispatch_all)
        monkeypatch.setattr(ServerTasks, "serve", serve)
        with pytest.raises(OperationalError):
            await rt.step()
        assert upstream.received == []  # the call waited for a commit that never came
        monkeypatch.undo()
        await db(close_old_connections)()  # the terminated one
        await rt.stop()

        await asyncio.wait_for(Runtime().run(asyncio.Event(), until_idle=True), GUARD_S)
        request = await db(Request.objects.get)(pk=request.pk)
        assert (request.state, request.attempts) == (State.COMPLETED, 1)
        assert len(upstream.received) == 1  # run once
    finally:
        upstream.close()

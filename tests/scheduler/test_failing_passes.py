"""A pass that raises (a bug in the policy, rows it does not expect) does not stop the
worker: what it runs goes on to its end, it says so (a traceback once, its row, its health)
and tries again, backing off, until a pass works; then it plans as before."""

import asyncio
import logging
import threading

import pytest
from asgiref.sync import sync_to_async

from scheduler.models import State, Worker
from scheduler.runtime import failing_passes, loop
from scheduler.worker_health import WorkerHealth
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed, state_of  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


@pytest.fixture
def upstream():
    up = Upstream(["m1"])
    up.gate = threading.Event()  # its answers wait for the test
    yield up
    up.gate.set()
    up.close()


def test_the_wait_between_tries_doubles_up_to_a_minute():
    failing = failing_passes.FailingPasses()
    now = factories.timezone.now()
    waits = [failing.failed(KeyError(None), now) for _ in range(8)]
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60]
    assert (failing.count, failing.error) == (8, "KeyError: None")
    assert failing.worked(now) and failing.since is None and not failing.worked(now)


async def test_a_worker_whose_passes_raise_serves_what_it_runs_and_plans_again_once_they_work(
    upstream, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="scheduler")
    monkeypatch.setattr(failing_passes, "FIRST_RETRY_S", 0.05)
    served = await db(factories.server)("up", kind="openai", base_url=upstream.url)
    await db(factories.deployment)(served, "m1", state="loaded")
    await db(factories.deployment)(await db(factories.server)("sim"), "m2")  # a pass loads it
    running = Running()
    async with running:
        rt = running.runtime
        first = await db(factories.request)("m1")
        await running.until(lambda: state_of(first) == State.PROCESSING)
        assert await asyncio.to_thread(upstream.arrived.wait, 10)

        broken = True
        planned = loop.plan_explained

        def plan_with_a_bug(snapshot, now):
            if broken:
                raise KeyError(None)
            return planned(snapshot, now)

        monkeypatch.setattr(loop, "plan_explained", plan_with_a_bug)
        second = await db(factories.request)("m2")
        failing = Worker.objects.filter(pk=rt.worker_id, failing_since__isnull=False)
        row = await running.until(failing.first)
        assert row.failing_error == "KeyError: None"
        health = WorkerHealth(rt)
        health.last_pass = asyncio.get_running_loop().time()
        status, body = health.state()
        assert (status, body["status"], body["error"]) == (503, "failing", "KeyError: None")

        # What runs goes on: its answer comes and is stored, though no pass works.
        upstream.gate.set()
        await running.until(lambda: state_of(first) == State.COMPLETED)
        assert await db(state_of)(second) == State.PENDING and not running.task.done()

        broken = False  # the next try works, and plans what waited
        await running.until(lambda: state_of(second) == State.COMPLETED)
        row = await db(Worker.objects.get)(pk=rt.worker_id)
        assert (row.failing_since, row.failing_error) == (None, "")
        assert rt.failing.since is None
    said = [r for r in caplog.records if "a pass failed" in r.getMessage()]
    assert said[0].exc_info is not None  # the traceback, once
    assert all(r.exc_info is None for r in said[1:])
    assert "passes work again, after" in caplog.text

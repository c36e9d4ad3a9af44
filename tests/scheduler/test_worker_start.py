"""What a worker says as it starts: simulated servers live in each worker's memory, so with
another worker running they disagree (one loads a model, the other's status sync marks it
unloaded, and its sends find it missing); the worker says so, and how to run the demo."""

import logging

import pytest
from asgiref.sync import sync_to_async

from scheduler.models import Worker
from scheduler.runtime import Runtime
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


async def started_and_stopped() -> None:
    runtime = Runtime()
    await runtime.start()
    await runtime.stop()


async def test_a_second_worker_beside_simulated_servers_is_warned(caplog):
    caplog.set_level(logging.INFO, logger="scheduler")
    await db(factories.server)("sim-a")
    await db(factories.server)("gpu", kind="openai", base_url="http://127.0.0.1:9")
    await started_and_stopped()  # alone: nothing to say
    assert "simulated servers" not in caplog.text

    await db(Worker.objects.create)(host="other", pid=1)
    await started_and_stopped()
    assert "simulated servers (sim-a) live in each worker's memory, and 1 other" in caplog.text
    assert "Run one worker for a demo" in caplog.text

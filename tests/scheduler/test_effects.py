"""The loop driven through a recording `Effects`: what each pass starts, without a server,
an adapter or a patch."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from backends.models import Deployment, DeploymentState
from scheduler.models import Request, State
from scheduler.runtime import Runtime
from scheduler.runtime.effects import Effects
from tests import factories
from tests.support.effects import RecordingEffects
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


def states() -> list[tuple[str, str]]:
    requests = [r.state for r in Request.objects.order_by("created_at")]
    return [*requests, *Deployment.objects.order_by("pk").values_list("state", flat=True)]


async def test_a_pass_starts_a_load_for_a_model_nowhere_loaded_then_sends_its_request():
    def setup() -> Request:
        factories.deployment(factories.server("s1"), "m1")
        return factories.request("m1")

    request = await db(setup)()
    effects = RecordingEffects()
    rt = Runtime(effects)
    await rt.start()
    try:
        await rt.step()
        assert effects.started == ["load m1@s1"]
        assert await db(states)() == [State.NEEDS_LOADING, DeploymentState.LOADING]
        assert effects.adapters == {}  # nothing was called

        # As the load's task would report: the next pass marks the request ready and sends it.
        await db(Deployment.objects.update)(state=DeploymentState.LOADED)
        await rt.step()
        assert effects.started == ["load m1@s1", f"serve {request.pk}"]
        assert await db(states)() == [State.PROCESSING, DeploymentState.LOADED]
    finally:
        await rt.stop()
    # Stopped, the worker hands back what it held: the request waits for a worker again.
    assert await db(states)() == [State.PENDING, DeploymentState.LOADED]


async def test_a_request_not_due_yet_sets_the_loops_next_wake_on_the_effects_clock():
    effects = RecordingEffects()
    later = effects.at + timedelta(seconds=30)

    def setup() -> None:
        d = factories.deployment(factories.server("s1"), "m1", state=DeploymentState.LOADED)
        factories.request("m1", state=State.READY, deployment=d, not_before=later)

    await db(setup)()
    rt = Runtime(effects)
    await rt.start()
    try:
        assert await rt.step() == []
        assert rt.next_wake == later and effects.started == []
        effects.at = later  # the clock moves on: the request is due
        await rt.step()
        assert [name.split()[0] for name in effects.started] == ["serve"]
    finally:
        await rt.stop()


async def test_stopping_cancels_the_tasks_a_cancelled_task_starts_as_it_ends():
    """A request's call that fails as the worker stops starts a status sync; that sync is
    cancelled too, before the adapters close (it crashed the worker on a closed client)."""
    effects = Effects()  # tasks that run: the recording one runs none
    started: list[asyncio.Task] = []
    serving = asyncio.Event()

    async def sync() -> None:
        await asyncio.Event().wait()

    async def serve() -> None:
        try:
            serving.set()
            await asyncio.Event().wait()
        finally:  # as `serve_failed` asks for a sync
            started.append(effects.start("sync 1", sync(), lambda *_: None))

    effects.start("serve 1", serve(), lambda *_: None)
    await serving.wait()  # at its server
    await effects.cancel_all()
    assert len(started) == 1 and started[0].cancelled()
    assert effects.tasks == {}


async def test_a_task_started_after_the_worker_stopped_never_runs():
    """A send whose commit came back after the stop starts its serve task late: on closed
    adapters it would fail, ask for a status sync, and that sync crashed on a closed client.
    Once the adapters are closed, a task is cancelled before it runs."""
    effects = Effects()
    ran: list[str] = []

    async def serve() -> None:
        ran.append("serve")

    await effects.cancel_all()
    await effects.close_adapters()
    task = effects.start("serve 1", serve(), lambda *_: None)
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and ran == []
    assert effects.tasks == {}

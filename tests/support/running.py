"""Run the scheduler's Runtime in-process for a test and wait on facts, never on time.

`Running.until(fact)` re-checks `fact` (a sync function, run on the DB thread) after every
pass of the loop (one that failed too) and after every task whose end called for no pass (a
completed request while nothing else waits), so every change the runtime makes is followed
by a check. The timeout only bounds a test that would otherwise hang.
"""

import asyncio
from collections.abc import Callable

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from backends.adapters.simulated import simulated_server
from backends.models import Deployment, DeploymentState
from scheduler import wakeup
from scheduler.models import TERMINAL_STATES, Request
from scheduler.runtime import Runtime
from tests import factories

TIMEOUT_S = 15.0


def all_ended() -> bool:
    """No request is left unended (a fact for `Running.until`)."""
    return not Request.objects.exclude(state__in=TERMINAL_STATES).exists()


class Running:
    def __init__(self) -> None:
        self.runtime = Runtime()
        self.stop = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> "Running":
        self.task = asyncio.create_task(self.runtime.run(self.stop))
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        async with asyncio.timeout(TIMEOUT_S):
            await self.task

    async def until(
        self, fact: Callable[[], object], wake: bool = True, timeout: float = TIMEOUT_S
    ):
        """Return fact()'s first truthy value, checked after each pass or quiet end. With
        `wake` the loop is woken first, as the API does after storing a request (rows a test
        writes itself wake nothing)."""
        rt = self.runtime
        if wake:
            wakeup.wake_local()
        async with asyncio.timeout(timeout):
            while True:
                seen = (rt.passes, rt.quiet_ends, rt.failing.count)
                if value := await sync_to_async(fact)():
                    return value
                if self.task.done():
                    self.task.result()
                    raise AssertionError("the runtime stopped before the fact held")
                async with rt.passed:
                    await rt.passed.wait_for(
                        lambda seen=seen: (
                            (rt.passes, rt.quiet_ends, rt.failing.count) != seen or self.task.done()
                        )
                    )

    async def passes(self, n: int = 1) -> None:
        """Wake the loop and wait for `n` more passes (to show that something did not
        happen although the runtime looked)."""
        rt = self.runtime
        target = rt.passes + n
        async with asyncio.timeout(TIMEOUT_S):
            while rt.passes < target:
                seen = rt.passes
                wakeup.wake_local()
                async with rt.passed:
                    await rt.passed.wait_for(lambda seen=seen: rt.passes > seen)


@pytest.fixture
async def db_thread_closed():
    """Close the connection of the thread that runs `sync_to_async` calls after a test, so
    PostgreSQL can drop the test database at the end."""
    yield
    await sync_to_async(connections.close_all)()


def state_of(request: Request) -> str:
    return Request.objects.values_list("state", flat=True).get(pk=request.pk)


def deployment_state(model: str) -> str:
    return Deployment.objects.values_list("state", flat=True).get(model__name=model)


def loaded_on(server_name: str, model: str) -> None:
    Deployment.objects.filter(model__name=model).update(state=DeploymentState.LOADED)
    simulated_server(server_name).loaded.add(model)


def one_loaded_request(**fields) -> Request:
    """A request for m1, loaded on the simulated server s1."""
    factories.deployment(factories.server("s1"), "m1")
    loaded_on("s1", "m1")
    return factories.request("m1", **fields)


async def status_syncs(server_id: int, times: int = 3) -> None:
    """A worker's status sync of one server, `times` over (what is said once is said once),
    then its adapters closed."""
    runtime = Runtime()
    try:
        for _ in range(times):
            await runtime.server_tasks.sync_server(server_id)
    finally:
        await runtime.effects.close_adapters()

"""What the failure tests share (their fixtures, a real HTTP server that fails on purpose and
retry and breaker times shrunk, are in `tests/scheduler/conftest.py`): a server row in front
of that server, a worker run until idle, and short reads of what the worker did."""

import asyncio

from backends.models import DeploymentState, Server
from scheduler.models import Request
from scheduler.runtime import Runtime
from tests import factories
from tests.support.flaky_upstream import FlakyUpstream

DS = DeploymentState


def setup_server(upstream: FlakyUpstream, state: str = DS.LOADED, **fields) -> Server:
    srv = factories.server("up", kind="openai", base_url=upstream.url, **fields)
    factories.deployment(srv, "m1", state=state)
    return srv


def requested(upstream: FlakyUpstream, server: dict | None = None, **fields) -> Request:
    """A server row in front of `upstream` (with `server` fields) and a request for m1."""
    setup_server(upstream, **(server or {}))
    return factories.request("m1", **fields)


async def run_until_idle() -> None:
    await Runtime().run(asyncio.Event(), until_idle=True)


def traces(request: Request) -> list[tuple[str, str, str]]:
    return list(request.traces.values_list("from_state", "to_state", "reason"))


def state_of(request: Request) -> str:
    return Request.objects.values_list("state", flat=True).get(pk=request.pk)


def server_health() -> str:
    return Server.objects.values_list("health", flat=True).get()

"""The adapter tests run one adapter against a replay of its server's API. Each adapter test
module says how to build its adapter with a `make_adapter` fixture; `server` and `adapter`
come from here."""

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from backends.adapters.http import HttpAdapter
from tests.support.replay_server import ReplayServer


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.fixture
async def adapter_on(
    make_adapter: Callable[[str], HttpAdapter],
) -> AsyncIterator[Callable[[str], HttpAdapter]]:
    """Builds the module's adapter on a URL; every one built is closed after the test."""
    built: list[HttpAdapter] = []

    def build(url: str) -> HttpAdapter:
        adapter = make_adapter(url)
        adapter.poll_interval_s = 0  # test servers answer at once: polling need not wait
        built.append(adapter)
        return adapter

    yield build
    for adapter in built:
        await adapter.close()


@pytest.fixture
def adapter(server: ReplayServer, adapter_on: Callable[[str], HttpAdapter]) -> HttpAdapter:
    return adapter_on(server.url)

"""An operator's new server reaches a running worker at once: the commit wakes it (in its
process; on PostgreSQL, every worker by NOTIFY), and a server it has not asked yet is asked
what it holds in that pass. It read `unknown` on the dashboard, and took no work, until the
next round of status syncs (up to `SWITCHYARD_STATUS_SYNC_S`)."""

import pytest
from asgiref.sync import sync_to_async

from backends.models import Health, Server
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


@pytest.fixture
def upstream():
    up = Upstream(["m1"])
    yield up
    up.close()


@pytest.fixture
def slow_rounds(knobs):
    """No status sync round and no safety-net pass within a test: only a wake-up can do it."""
    return knobs(STATUS_SYNC_S=3600.0, POLL_INTERVAL_S=3600.0)


def health(name: str) -> str:
    return Server.objects.values_list("health", flat=True).get(name=name)


async def test_a_new_server_is_asked_what_it_holds_at_once(upstream, slow_rounds):
    running = Running()
    async with running:
        await running.passes(1)  # the first round of status syncs is done: no servers
        off = await db(Server.objects.create)(
            name="off", kind="openai", base_url=upstream.url, enabled=False
        )
        added = await db(Server.objects.create)(name="up", kind="openai", base_url=upstream.url)
        assert added.health == Health.UNKNOWN
        await running.until(lambda: health("up") == Health.UP, wake=False)
        assert await db(health)(off.name) == Health.UNKNOWN  # disabled: not asked

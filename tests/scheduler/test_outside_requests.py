"""An eviction on a server that others call directly too: requests the server runs on the
victim that Switchyard did not send finish first (for up to `OUTSIDE_GRACE_S`), since
unloading it cuts them off. The server's count is the adapter's `running` (llama.cpp's
`/slots`), set here by hand on a simulated server; against the real llama.cpp router:
tests/integration/test_real_llama_outside.py."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.simulated import SimulatedAdapter, simulated_server
from backends.models import Deployment
from scheduler.models import State
from scheduler.runtime import server_tasks
from tests import factories
from tests.support.running import (  # noqa: F401 (fixture)
    Running,
    db_thread_closed,
    loaded_on,
    state_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


@pytest.fixture
def outside(monkeypatch) -> dict[str, int]:
    """What the simulated server says it runs of each model that Switchyard did not send."""
    counts: dict[str, int] = {}

    async def running(adapter, server_model_id: str) -> int:
        return counts.get(server_model_id, 0)

    monkeypatch.setattr(SimulatedAdapter, "running", running)
    return counts


def theirs_loaded_on_a_one_model_server() -> None:
    """s1 holds one model: `theirs` is loaded there, `ours` is not."""
    s1 = factories.server("s1", max_llm=1)
    for name in ("theirs", "ours"):
        factories.deployment(s1, name)
    loaded_on("s1", "theirs")


def said(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


async def test_an_eviction_lets_requests_it_did_not_send_finish_first(outside, caplog):
    await db(theirs_loaded_on_a_one_model_server)()
    outside["theirs"] = 1
    ours = await db(factories.request)("ours")
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            waiting = "s1 first lets 1 request(s) on theirs that Switchyard did not send finish"
            await running.until(lambda: said(caplog, waiting))
            assert simulated_server("s1").loaded == {"theirs"}  # not cut off
            outside["theirs"] = 0
            await running.until(lambda: state_of(ours) == State.COMPLETED)
    assert simulated_server("s1").loaded == {"ours"}
    assert not said(caplog, "cuts off")
    # The wait (at least one look again, OUTSIDE_POLL_S) is no part of the load's own time,
    # which ETAs and the policy's prices read.
    load_s = await db(lambda: Deployment.objects.get(model__name="ours").avg_load_s)()
    assert load_s < server_tasks.OUTSIDE_POLL_S


async def test_requests_it_did_not_send_are_cut_off_after_the_grace(outside, caplog, knobs):
    knobs(OUTSIDE_GRACE_S=0.2)
    await db(theirs_loaded_on_a_one_model_server)()
    outside["theirs"] = 1  # and so it stays
    ours = await db(factories.request)("ours")
    with caplog.at_level(logging.INFO, logger="scheduler"):
        async with Running() as running:
            await running.until(lambda: state_of(ours) == State.COMPLETED)
    assert said(caplog, "unloading theirs from s1 for ours cuts off 1 request(s)")

"""The original design note's two scenarios on simulated servers, times scaled down 100×
(a 90 s load takes 0.9 s). Assertions read the Trace timestamps."""

import asyncio

import pytest

from scheduler.models import Request, State
from scheduler.runtime import Runtime
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


async def run_until_idle() -> None:
    await Runtime().run(asyncio.Event(), until_idle=True)


def reached(request: Request, state: str):
    return next(t.at for t in request.traces.all() if t.to_state == state)


def setup_servers():
    s1 = factories.server("s1")
    s2 = factories.server("s2")
    factories.deployment(s1, "model-1", load_s=0.9)
    factories.deployment(s1, "model-3", load_s=0.9)
    factories.deployment(s2, "model-2", load_s=0.9, state="loaded")
    return s1, s2


async def test_request_for_unloaded_model_is_loaded_processed_and_answered():
    from asgiref.sync import sync_to_async

    request = await sync_to_async(_scenario_one_setup)()
    await run_until_idle()
    await request.arefresh_from_db()
    assert request.state == State.COMPLETED
    states = [(t.from_state, t.to_state) async for t in request.traces.all()]
    # The one wait with a reason: for the load (traced in the state it waits in).
    assert [to for _, to in states] == [
        "needs_loading",
        "needs_loading",
        "ready",
        "processing",
        "completed",
    ]
    assert states[1] == ("needs_loading", "needs_loading")
    assert request.result["choices"][0]["message"]["content"]


def _scenario_one_setup() -> Request:
    s1 = factories.server("s1")
    factories.deployment(s1, "model-1", load_s=0.9)
    return factories.request("model-1")


async def test_loaded_model_is_not_held_up_by_loads_on_another_server(knobs):
    knobs(MIN_RESIDENCY_S=0)  # the design note predates the residency rule
    from asgiref.sync import sync_to_async

    a, b, c = await sync_to_async(_scenario_two_setup)()
    await run_until_idle()

    def check() -> None:
        for r in (a, b, c):
            r.refresh_from_db()
            assert r.state == State.COMPLETED, list(r.traces.values_list("to_state", "reason"))
        # B never waited for a load: straight to ready, done before A's model is loaded.
        assert [t.to_state for t in b.traces.all()] == ["ready", "processing", "completed"]
        assert reached(b, "completed") < reached(a, "ready")
        # A then C load one after the other on S1 (one load at a time per server).
        assert a.server.name == c.server.name == "s1"
        assert reached(a, "ready") < reached(c, "ready")
        c_load_started = reached(c, "needs_loading")
        assert reached(a, "processing") <= reached(c, "ready")
        assert c_load_started <= reached(c, "ready")

    await sync_to_async(check)()


def _scenario_two_setup():
    s1, s2 = setup_servers()
    from django.utils import timezone

    from backends.adapters.simulated import simulated_server
    from backends.models import Deployment

    Deployment.objects.filter(model__name="model-2").update(loaded_at=timezone.now())
    simulated_server("s2").loaded.add("model-2")
    a = factories.request("model-1")
    b = factories.request("model-2")
    c = factories.request("model-3")
    return a, b, c

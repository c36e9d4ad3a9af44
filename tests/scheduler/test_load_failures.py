"""Failed loads, through real HTTP servers that fail on purpose: retries after clearing the
server, giving up, a server busy for now, a model it does not have, and timeouts."""

import logging
import threading

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.base import AdapterError, ErrorCode
from backends.models import Deployment, DeploymentState, Server
from scheduler import store
from scheduler.models import State
from tests import factories
from tests.support.failing import run_until_idle, setup_server, state_of
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)
from tests.support.swap_upstream import SwapUpstream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState


async def test_a_failed_load_is_retried_after_evicting_everything_idle(fast, caplog):
    """The server has room for one model though Switchyard was told two: loading a second
    fails out of memory, and the retry first clears the server."""
    swap = SwapUpstream(["m1", "bystander"], room=1)
    swap.running.append("bystander")
    try:

        def setup():
            srv = factories.server("swap", kind="llamaswap", base_url=swap.url, max_llm=2)
            factories.deployment(srv, "m1")
            factories.deployment(srv, "bystander", state=DS.LOADED)
            return factories.request("m1")

        request = await db(setup)()
        with caplog.at_level(logging.INFO, logger="scheduler.store"):
            await run_until_idle()
    finally:
        swap.close()
    assert await db(state_of)(request) == State.COMPLETED
    assert swap.loads == ["m1", "m1"] and swap.running == ["m1"]
    messages = [r.getMessage() for r in caplog.records]
    loads = [m for m in messages if m.startswith("loading m1 on")]
    assert "evicting" not in loads[0]  # room for both, as far as Switchyard knew
    assert loads[1].endswith("evicting bystander")  # after the failure: clear the server
    assert any("CUDA out of memory; retrying in 0 s" in m for m in messages)
    assert await db(lambda: Deployment.objects.get(model__name="bystander").state)() == DS.UNLOADED


async def test_a_load_that_keeps_failing_gives_up_and_fails_its_requests(fast, knobs):
    knobs(LOAD_ATTEMPTS=2, BREAKER_FAILURES=10)
    swap = SwapUpstream(["m1"])
    swap.fail_loads = [(500, "upstream crashed")] * 2
    try:

        def setup():
            srv = factories.server("swap", kind="llamaswap", base_url=swap.url)
            factories.deployment(srv, "m1")
            return factories.request("m1")

        request = await db(setup)()
        await run_until_idle()
    finally:
        swap.close()
    await request.arefresh_from_db()
    assert request.state == State.FAILED
    assert "upstream crashed" in request.error
    assert swap.loads == ["m1", "m1"]
    d = await Deployment.objects.aget()
    assert d.state == DS.FAILED


def test_a_server_too_busy_to_load_is_asked_again_past_the_attempts(knobs):
    """A server that says it is full for now (llama-server's router at --models-max with
    every model busy) is no broken model: its load is retried, with backoff, however often
    it says so. Another failure still gives up after the attempts."""
    knobs(LOAD_ATTEMPTS=2)
    factories.deployment(factories.server("s1"), "m1")
    worker = store.register_worker()

    def load_fails(error: AdapterError) -> Deployment:
        job = store.start_load(Deployment.objects.get().pk, (), worker, "test")
        store.load_failed(job, error)
        return Deployment.objects.get()

    full = AdapterError(ErrorCode.BUSY, "model limit reached, try again later")
    for attempt in range(1, 5):
        d = load_fails(full)
        assert (d.state, d.load_failures, d.last_error_code) == (DS.UNLOADED, attempt, "busy")
        assert d.next_load_at is not None
    d = load_fails(AdapterError(ErrorCode.LOAD_FAILED, "exit code 1"))
    assert (d.state, d.last_error) == (DS.FAILED, "exit code 1")


async def test_a_model_the_server_does_not_have_fails_its_waiting_requests_at_once(upstream):
    def setup():
        srv = factories.server("up", kind="openai", base_url=upstream.url, slots=2)
        factories.deployment(srv, "m2", server_model_id="ghost")
        return [factories.request("m2") for _ in range(2)]

    requests = await db(setup)()
    await run_until_idle()
    for request in requests:
        await request.arefresh_from_db()
        assert (request.state, request.error_code) == ("failed", "not_found")
        assert "ghost is not listed" in request.error
    d = await Deployment.objects.aget()
    assert (d.state, d.last_error_code) == (DS.FAILED, "not_found")


async def test_a_load_that_times_out_counts_as_a_failure(upstream, knobs):
    knobs(STATUS_SYNC_S=3600)
    upstream.models = []  # not listed (so not loaded) at the first status sync

    def setup():
        srv = setup_server(upstream, state=DS.UNLOADED)
        Deployment.objects.update(load_options={})
        srv.deployments.get().model.__class__.objects.update(load_timeout_s=1)
        return srv

    srv = await db(setup)()
    async with Running() as running:
        await running.until(lambda: Server.objects.get(pk=srv.pk).last_seen)  # first sync
        upstream.models = ["m1"]
        upstream.listing_gate = threading.Event()  # the "load" now hangs
        request = await db(factories.request)("m1")
        d = await running.until(lambda: Deployment.objects.filter(load_failures=1).first())
        upstream.listing_gate.set()
    assert (d.state, d.last_error) == (DS.UNLOADED, "load timed out after 1 s")
    assert d.next_load_at is not None  # retried after its backoff
    assert await db(state_of)(request) != State.COMPLETED

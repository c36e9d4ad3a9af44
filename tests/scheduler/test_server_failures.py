"""A server failing, through the real OpenAI-compatible adapter against a real HTTP server
that fails on purpose: the circuit breaker, its probes and cooldowns, status sync, and
servers going away, moving and coming back."""

import asyncio
import logging
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from backends.adapters.base import AdapterError, ErrorCode, ServerModel
from backends.models import Deployment, DeploymentState, Health, Server
from scheduler import store
from scheduler.models import Request, State
from scheduler.runtime import Runtime
from tests import factories
from tests.support.failing import (
    requested,
    run_until_idle,
    server_health,
    setup_server,
    state_of,
    traces,
)
from tests.support.flaky_upstream import FlakyUpstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState


async def test_breaker_opens_after_three_failures_and_one_probe_closes_it(
    upstream, fast, knobs, caplog
):
    # A first cooldown (RETRY_BASE_S) long enough for a pass to see it on a busy machine:
    # at 0.02 s the probe could close it before any pass sent the requests back.
    knobs(REQUEST_ATTEMPTS=5, RETRY_BASE_S=0.5)
    upstream.fail_next = [(500, "boom")] * 3

    def three_requests() -> list[Request]:
        setup_server(upstream, slots=3)
        return [factories.request("m1") for _ in range(3)]

    requests = await db(three_requests)()
    with caplog.at_level(logging.INFO):
        await run_until_idle()
    messages = [r.getMessage() for r in caplog.records]
    opened = [m for m in messages if "in cooldown until" in m]
    assert len(opened) == 1 and "3 failures in a row" in opened[0]
    assert any("answered its probe" in m for m in messages)

    def check():
        for request in requests:
            request.refresh_from_db()
            assert request.state == State.COMPLETED
            assert request.attempts == 2  # a failure, then one after the probe
            assert any("server up is unavailable" in reason for *_, reason in traces(request))
            # Sent back to pending from the server it left, which its trace row names.
            back = request.traces.filter(to_state="pending", reason__contains="unavailable")
            assert {t.server for t in back} == {"up"}
        srv = Server.objects.get()
        assert (srv.health, srv.consecutive_failures, srv.cooldown_until) == (Health.UP, 0, None)

    await db(check)()


async def test_one_requests_own_retries_count_once_toward_the_breaker(upstream, fast, knobs):
    """A server that fails one request again and again (a poison input) while it serves
    others stays up: that request's retries count once, so it alone never puts the server in
    cooldown for every model on it. One that cannot be reached counts every time."""
    knobs(REQUEST_ATTEMPTS=4)
    upstream.fail_next = [(500, "boom")] * 4
    request = await db(requested)(upstream)
    await run_until_idle()

    def check():
        request.refresh_from_db()
        assert (request.state, request.attempts) == (State.FAILED, 4)
        srv = Server.objects.get()
        assert (srv.health, srv.consecutive_failures) == (Health.UP, 1)

    await db(check)()


async def test_an_answers_mark_waits_for_the_pass_and_never_undoes_a_later_failure(upstream):
    """A server's answer marks it up after the pass that the answer calls for (the next
    request's dispatch goes to the database first); a failure on that server meanwhile drops
    the mark, which would otherwise write the server back up over the failure."""
    srv = await db(setup_server)(upstream, health=Health.COOLDOWN, consecutive_failures=2)
    runtime = Runtime()
    runtime.server_tasks.server_answered(srv.pk)
    runtime.server_tasks.forget_answers(srv.pk)  # a failure on that server before the pass
    runtime.server_tasks.write_marks()
    assert not runtime.effects.chores and await db(server_health)() == Health.COOLDOWN
    runtime.server_tasks.server_answered(srv.pk)
    assert not runtime.effects.chores  # not before the pass
    runtime.server_tasks.write_marks()  # after it
    await asyncio.gather(*runtime.effects.chores)
    assert await db(server_health)() == Health.UP


async def test_a_failed_probe_keeps_the_server_in_cooldown(upstream, knobs):
    knobs(RETRY_BASE_S=1000, BREAKER_COOLDOWN_S=3600)
    upstream.close()  # nothing answers on its port
    ended = timezone.now() - timedelta(seconds=1)

    def setup():
        setup_server(upstream)
        Server.objects.update(health=Health.COOLDOWN, cooldown_until=ended, consecutive_failures=3)

    await db(setup)()

    def cooldown_renewed():
        srv = Server.objects.get()
        return srv.cooldown_until > timezone.now() and srv

    async with Running() as running:
        srv = await running.until(cooldown_renewed)
    assert srv.health == Health.COOLDOWN
    assert srv.cooldown_until > timezone.now() + timedelta(seconds=1500)  # the second: 2000 s


def test_cooldowns_in_a_row_grow_from_seconds_to_the_longest(knobs):
    """A server restarted in seconds is back in seconds: the first cooldown is short, each
    failed probe doubles the next, up to BREAKER_COOLDOWN_S; an answer starts again from
    the shortest. Calls that fail while it cools down (those under way when it tripped)
    do not count: they made the next cooldown the longest at once."""
    knobs(BREAKER_FAILURES=3, RETRY_BASE_S=2.0, BREAKER_COOLDOWN_S=60.0)
    server = factories.server("gpu", kind="openai", base_url="http://127.0.0.1:9")
    refused = AdapterError(ErrorCode.CONNECTION, "connection refused")

    def cooldown_s(then) -> int:
        srv = Server.objects.get()
        assert srv.health == Health.COOLDOWN
        return round((srv.cooldown_until - then).total_seconds())

    def trip() -> int:
        then = timezone.now()
        for _ in range(3):
            store.server_failed(server.pk, "connection refused")
        return cooldown_s(then)

    def probe_fails() -> int:
        then = timezone.now()
        store.probe_result(server.pk, refused)
        return cooldown_s(then)

    assert trip() == 2
    for _ in range(10):  # the calls under way when it tripped
        store.server_failed(server.pk, "connection refused")
    assert [probe_fails() for _ in range(6)] == [4, 8, 16, 32, 60, 60]
    store.probe_result(server.pk, None)
    assert Server.objects.get().health == Health.UP
    assert trip() == 2


async def test_status_sync_notices_a_model_loaded_then_unloaded_outside_switchyard(upstream, knobs):
    knobs(STATUS_SYNC_S=0.05)
    await db(setup_server)(upstream, state=DS.UNLOADED)  # loaded there, not by us
    async with Running() as running:
        d = await running.until(lambda: Deployment.objects.filter(state=DS.LOADED).first())
        assert d.load_progress == 1.0  # as a load of ours leaves it
        upstream.models.remove("m1")
        d = await running.until(lambda: Deployment.objects.filter(state=DS.UNLOADED).first())
        assert d.load_progress is None  # no load's figure outlives its model (operator API)


async def test_an_unreachable_server_is_marked_down_and_comes_back_by_itself(upstream, knobs):
    knobs(STATUS_SYNC_S=0.05)
    upstream.close()
    await db(setup_server)(upstream)
    async with Running() as running:
        await running.until(lambda: server_health() == Health.DOWN)
        request = await db(factories.request)("m1")
        await running.passes(2)
        assert await db(state_of)(request) == State.PENDING  # waits for a usable server
        upstream.start()
        await running.until(lambda: state_of(request) == State.COMPLETED)
    assert await db(server_health)() == Health.UP


async def test_a_server_moved_to_a_new_address_in_admin_is_reached_there(upstream, knobs):
    """The operator's fix reaches the worker with the next status sync, even for a server
    whose probes keep failing at the old address."""
    knobs(STATUS_SYNC_S=0.05)
    upstream.close()
    await db(setup_server)(upstream)
    with FlakyUpstream(["m1"]) as moved:
        async with Running() as running:
            await running.until(lambda: server_health() == Health.DOWN)
            request = await db(factories.request)("m1")
            await db(Server.objects.update)(base_url=moved.url)
            await running.until(lambda: state_of(request) == State.COMPLETED)
        assert moved.inferences == 1
    assert upstream.inferences == 0


def test_a_server_back_up_says_so_beside_what_its_restart_changed(caplog):
    """Its models went with the restart: the log says both, not only the models."""
    caplog.set_level(logging.INFO, logger="scheduler")
    srv = factories.server("box", health=Health.DOWN)
    factories.deployment(srv, "m1", state=DS.LOADED)
    asked = timezone.now() + timedelta(seconds=1)
    assert store.apply_server_models(srv.pk, [ServerModel("m1")], asked).changes == [
        "m1 was unloaded outside Switchyard"
    ]
    assert "status sync of server box: back up; m1 was unloaded outside Switchyard" in caplog.text
    assert Server.objects.get(pk=srv.pk).health == Health.UP

"""The failure rules, through the real OpenAI-compatible adapter against a real HTTP server
that fails on purpose: request retries with backoff, re-routing, bad requests, the circuit
breaker, load failures and timeouts, status sync, and servers going away and coming back."""

import asyncio
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from backends.adapters.base import AdapterError, ErrorCode, ServerModel
from backends.models import Deployment, DeploymentState, Health, Server
from scheduler import store
from scheduler.api.inference import error_of
from scheduler.models import Request, State
from scheduler.retry import backoff_s
from scheduler.runtime import Runtime
from tests import factories
from tests.support.flaky_upstream import FlakyUpstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)
from tests.support.swap_upstream import SwapUpstream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState


@pytest.fixture
def upstream() -> Iterator[FlakyUpstream]:
    with FlakyUpstream(["m1"]) as up:
        yield up


@pytest.fixture
def fast(knobs):
    """Retry and breaker times shrunk a hundredfold."""
    return knobs(RETRY_BASE_S=0.02, RETRY_MAX_S=0.15, BREAKER_COOLDOWN_S=0.6)


def setup_server(upstream: FlakyUpstream, state: str = DS.LOADED, **fields) -> Server:
    srv = factories.server("up", kind="openai", base_url=upstream.url, **fields)
    factories.deployment(srv, "m1", state=state)
    return srv


async def run_until_idle() -> None:
    await Runtime().run(asyncio.Event(), until_idle=True)


def traces(request: Request) -> list[tuple[str, str, str]]:
    return list(request.traces.values_list("from_state", "to_state", "reason"))


def state_of(request: Request) -> str:
    return Request.objects.values_list("state", flat=True).get(pk=request.pk)


def server_health() -> str:
    return Server.objects.values_list("health", flat=True).get()


def test_backoff_doubles_from_its_base_up_to_its_ceiling():
    assert [backoff_s(n, 2.0, 15.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 15.0, 15.0]


async def test_a_failed_request_is_retried_with_exponential_backoff(upstream, fast):
    upstream.fail_next = [(500, "boom"), (502, "bad gateway")]
    request = await db(lambda: (setup_server(upstream), factories.request("m1"))[1])()
    await run_until_idle()

    def check():
        request.refresh_from_db()
        assert request.state == State.COMPLETED
        assert request.attempts == 3
        # Moves only (a wait's reason is traced in the state it waits in: "a retry, …").
        moves = [(to, reason) for was, to, reason in traces(request) if was != to]
        retries = [reason for to, reason in moves if to == State.READY][1:]
        assert retries == [
            "server_error: boom; retry 2 in 0.02 s",
            "server_error: bad gateway; retry 3 in 0.04 s",
        ]
        srv = Server.objects.get()
        assert (srv.health, srv.consecutive_failures) == (Health.UP, 0)

    await db(check)()


async def test_a_request_fails_once_its_attempts_are_spent(upstream, fast, knobs):
    knobs(REQUEST_ATTEMPTS=2, BREAKER_FAILURES=10)
    upstream.fail_next = [(500, "boom"), (500, "boom again")]
    request = await db(lambda: (setup_server(upstream), factories.request("m1"))[1])()
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts, request.error_code) == ("failed", 2, "server_error")
    assert request.error == "boom again"


async def test_a_bad_request_fails_at_once_without_retry(upstream, fast):
    upstream.fail_next = [(400, "temperature must be at most 2")]
    request = await db(lambda: (setup_server(upstream), factories.request("m1"))[1])()
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts, request.error_code) == ("failed", 1, "bad_request")
    assert request.error == "temperature must be at most 2"
    assert upstream.inferences == 1
    assert await db(server_health)() == Health.UP  # the caller's fault, not the server's


async def test_a_stream_cut_after_its_first_chunk_is_not_retried(upstream, fast):
    """Running it again would send the caller a second beginning."""
    upstream.cut_streams = 1

    def setup():
        setup_server(upstream)
        return factories.request("m1", stream=True)

    request = await db(setup)()
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts, request.error_code) == ("failed", 1, "connection")
    assert (await db(traces)(request))[-1][2].endswith("(the stream had begun: not retried)")
    assert upstream.inferences == 1


async def test_a_stream_that_fails_before_its_first_chunk_is_retried(upstream, fast):
    upstream.fail_next = [(500, "boom")]

    def setup():
        setup_server(upstream)
        return factories.request("m1", stream=True)

    request = await db(setup)()
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts) == ("completed", 2)
    assert request.result["choices"][0]["message"]["content"] == "Hello from upstream"


async def test_model_no_longer_loaded_sends_the_request_back_to_routing(upstream, fast):
    upstream.fail_next = [(503, "model is not loaded")]
    request = await db(lambda: (setup_server(upstream), factories.request("m1"))[1])()
    await run_until_idle()

    def check():
        request.refresh_from_db()
        assert request.state == State.COMPLETED
        moves = [(f, t) for f, t, _ in traces(request)]
        assert moves[:3] == [
            ("pending", "ready"),
            ("ready", "processing"),
            ("processing", "pending"),
        ]
        # Routed again: to the model listed once more (the status sync after the failure
        # saw it), or to a new load of it, whichever came first.
        assert moves[3] in (("pending", "ready"), ("pending", "needs_loading"))
        assert moves[-2:] == [("ready", "processing"), ("processing", "completed")]
        assert "no longer has the model loaded" in traces(request)[2][2]

    await db(check)()


async def test_breaker_opens_after_three_failures_and_one_probe_closes_it(
    upstream, fast, knobs, caplog
):
    knobs(REQUEST_ATTEMPTS=5)
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
    request = await db(lambda: (setup_server(upstream), factories.request("m1"))[1])()
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


async def test_a_request_past_its_longest_wait_expires_and_the_log_says_why(upstream, caplog):
    def setup():
        setup_server(upstream, health=Health.DOWN)
        request = factories.request("m1", no_server_grace_s=3600)
        late = timezone.now() - timedelta(seconds=1)
        Request.objects.filter(pk=request.pk).update(expires_at=late)
        return request

    request = await db(setup)()
    with caplog.at_level(logging.WARNING, logger="scheduler.runtime"):
        await run_until_idle()
    await request.arefresh_from_db()
    assert request.state == State.EXPIRED
    reason = await db(lambda: request.traces.last().reason)()  # as its trace says it
    said = [r.getMessage() for r in caplog.records]
    assert f"request {request.pk} expired: {reason}" in said, said


async def test_an_expired_request_says_what_it_last_waited_for(upstream):
    """Not only how long it waited: the reason it was last given, which its caller (and
    the operator) can act on."""
    upstream.close()

    def setup():
        setup_server(upstream, health=Health.DOWN)
        return factories.request("m1", no_server_grace_s=3600)

    request = await db(setup)()
    async with Running() as running:
        await running.until(lambda: Request.objects.get(pk=request.pk).reason)
        late = timezone.now() - timedelta(seconds=1)
        await db(Request.objects.filter(pk=request.pk).update)(expires_at=late)
        await running.until(lambda: state_of(request) == State.EXPIRED)
    await request.arefresh_from_db()
    assert request.error.startswith("expired: still waiting after ")
    assert "s (last: no server can serve m1: up is down; fails at " in request.error


async def test_a_request_no_server_can_serve_fails_fast_with_503_naming_why(
    upstream, knobs, caplog
):
    """Its only server is down: after the grace (0 here) the request fails with
    no_server_available, and the API answers 503 with Retry-After and the server's state,
    instead of waiting silently to its class maximum. The worker's log says so too."""
    knobs(NO_SERVER_GRACE_S=0.0)

    def setup():
        setup_server(upstream, health=Health.DOWN)
        return factories.request("m1")

    request = await db(setup)()
    with caplog.at_level(logging.WARNING, logger="scheduler.runtime"):
        await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.error_code) == ("failed", "no_server_available")
    assert request.error == "no server can serve m1: up is down"
    said = f"request {request.pk} failed (no_server_available): no server can serve m1: up is down"
    assert said in [r.getMessage() for r in caplog.records]
    error = error_of(request)
    assert (error.status, error.code, error.headers()) == (
        503,
        "no_server_available",
        {"Retry-After": "30"},
    )


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

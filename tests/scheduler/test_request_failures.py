"""A request's failures, through the real OpenAI-compatible adapter against a real HTTP
server that fails on purpose: retries with backoff, re-routing, bad requests, streams cut,
expiry, and failing fast when no server can serve."""

import logging
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from backends.models import DeploymentState, Health, Server
from scheduler.api.inference import error_of
from scheduler.models import Request, State
from scheduler.retry import backoff_s
from tests.support.failing import (
    requested,
    run_until_idle,
    server_health,
    state_of,
    traces,
)
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState


def test_backoff_doubles_from_its_base_up_to_its_ceiling():
    assert [backoff_s(n, 2.0, 15.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 15.0, 15.0]


async def test_a_failed_request_is_retried_with_exponential_backoff(upstream, fast):
    upstream.fail_next = [(500, "boom"), (502, "bad gateway")]
    request = await db(requested)(upstream)
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
    request = await db(requested)(upstream)
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts, request.error_code) == ("failed", 2, "server_error")
    assert request.error == "boom again"


async def test_a_bad_request_fails_at_once_without_retry(upstream, fast):
    upstream.fail_next = [(400, "temperature must be at most 2")]
    request = await db(requested)(upstream)
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts, request.error_code) == ("failed", 1, "bad_request")
    assert request.error == "temperature must be at most 2"
    assert upstream.inferences == 1
    assert await db(server_health)() == Health.UP  # the caller's fault, not the server's


async def test_a_stream_cut_after_its_first_chunk_is_not_retried(upstream, fast):
    """Running it again would send the caller a second beginning."""
    upstream.cut_streams = 1

    request = await db(requested)(upstream, stream=True)
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts, request.error_code) == ("failed", 1, "connection")
    assert (await db(traces)(request))[-1][2].endswith("(the stream had begun: not retried)")
    assert upstream.inferences == 1


async def test_a_stream_that_fails_before_its_first_chunk_is_retried(upstream, fast):
    upstream.fail_next = [(500, "boom")]

    request = await db(requested)(upstream, stream=True)
    await run_until_idle()
    await request.arefresh_from_db()
    assert (request.state, request.attempts) == ("completed", 2)
    assert request.result["choices"][0]["message"]["content"] == "Hello from upstream"


async def test_model_no_longer_loaded_sends_the_request_back_to_routing(upstream, fast):
    upstream.fail_next = [(503, "model is not loaded")]
    request = await db(requested)(upstream)
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


async def test_a_request_past_its_longest_wait_expires_and_the_log_says_why(upstream, caplog):
    def setup():
        request = requested(upstream, {"health": Health.DOWN}, no_server_grace_s=3600)
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

    request = await db(requested)(upstream, {"health": Health.DOWN}, no_server_grace_s=3600)
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

    request = await db(requested)(upstream, {"health": Health.DOWN})
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

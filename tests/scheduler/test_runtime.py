"""The runtime end to end on simulated servers (and one real OpenAI-compatible upstream):
the life of a request, no head-of-line blocking, parallel loads, one load for all waiters,
no eviction of a busy model, and wake-ups instead of sleeps. Its fast paths:
test_fast_paths.py."""

import asyncio
import logging
import re
import threading
import uuid

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from access.models import ApiKey
from backends.models import Deployment, DeploymentState, Server
from scheduler import sql, store, wakeup
from scheduler.api import intake
from scheduler.models import Intent, Priority, State, Worker
from scheduler.runtime import FreedSlot, Runtime
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import (  # noqa: F401 (fixture)
    Running,
    db_thread_closed,
    deployment_state,
    loaded_on,
    one_loaded_request,
    state_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
LONG_LOAD_S = 600  # a load that never finishes within a test: it is cancelled at the end


async def test_request_travels_from_pending_to_completed_with_its_trace(caplog):
    caplog.set_level(logging.INFO, logger="scheduler")

    def setup():
        factories.deployment(factories.server("s1"), "m1")
        return factories.request("m1")

    request = await db(setup)()
    await Runtime().run(asyncio.Event(), until_idle=True)

    def check():
        request.refresh_from_db()
        assert request.state == State.COMPLETED
        traces = list(request.traces.all())
        assert [(t.from_state, t.to_state) for t in traces] == [
            ("pending", "needs_loading"),
            # Why it waits, stored as it changed (a trace row in its own state).
            ("needs_loading", "needs_loading"),
            ("needs_loading", "ready"),
            ("ready", "processing"),
            ("processing", "completed"),
        ]
        assert all(t.reason for t in traces)
        assert traces[1].reason == "waiting for the load of m1 on s1 (~10.0 s)"
        assert re.fullmatch(r"completed in (\d+ ms|\d+\.\d s)", traces[-1].reason)
        assert request.reason is None  # cleared once it no longer waits
        assert {t.server for t in traces} == {"s1"}  # each step names where it happened
        assert request.result["choices"][0]["message"]["content"]
        assert request.routed_at <= request.ready_at <= request.started_at <= request.finished_at
        d = Deployment.objects.get()
        assert (d.state, d.in_flight, d.worker) == (DeploymentState.LOADED, 0, None)
        assert not Worker.objects.exists()  # the worker removed its row on the way out
        # A small model's load takes milliseconds, and the log says how many.
        assert re.search(r"loaded m1@s1 in \d+ ms", caplog.text), caplog.text

    await db(check)()


async def test_a_long_load_does_not_hold_up_a_request_for_a_model_loaded_elsewhere():
    def setup():
        s1, s2 = factories.server("s1"), factories.server("s2")
        factories.deployment(s1, "slow", load_s=LONG_LOAD_S)
        factories.deployment(s2, "fast")
        loaded_on("s2", "fast")
        return factories.request("slow"), factories.request("fast")

    slow, fast = await db(setup)()
    async with Running() as running:
        await running.until(lambda: state_of(fast) == State.COMPLETED)
        assert await db(deployment_state)("slow") == DeploymentState.LOADING
        assert await db(state_of)(slow) == State.NEEDS_LOADING
    # Stopping cancelled the load and handed it back: the server never finished it.
    assert await db(deployment_state)("slow") == DeploymentState.UNLOADED


async def test_a_deep_line_for_a_loading_model_does_not_hide_a_loaded_one(monkeypatch):
    monkeypatch.setattr(store.snapshots, "SNAPSHOT_HEAD", 3)  # a deep line, at test scale

    def setup():
        s1, s2 = factories.server("s1"), factories.server("s2")
        factories.deployment(s1, "slow", load_s=LONG_LOAD_S)
        factories.deployment(s2, "fast")
        loaded_on("s2", "fast")
        ahead = [factories.request("slow") for _ in range(10)]
        return ahead, factories.request("fast")

    ahead, fast = await db(setup)()
    async with Running() as running:
        await running.until(lambda: state_of(fast) == State.COMPLETED)
        assert await db(state_of)(ahead[-1]) in (State.PENDING, State.NEEDS_LOADING)


async def test_loads_on_two_servers_run_in_parallel_but_one_at_a_time_per_server():
    def setup():
        s1 = factories.server("s1", max_llm=2)
        s2 = factories.server("s2")
        for srv, model in ((s1, "a"), (s1, "c"), (s2, "b")):
            factories.deployment(srv, model, load_s=LONG_LOAD_S)
        return [factories.request(m) for m in ("a", "b", "c")]

    await db(setup)()

    def loading() -> set[str]:
        rows = Deployment.objects.filter(state=DeploymentState.LOADING)
        return set(rows.values_list("model__name", flat=True))

    async with Running() as running:
        assert await running.until(lambda: len(loading()) == 2)
        await running.passes(3)
        assert await db(loading)() == {"a", "b"}  # c waits for a's load on s1
        assert await db(deployment_state)("c") == DeploymentState.UNLOADED


async def test_one_load_serves_every_request_waiting_for_the_model(caplog):
    def setup():
        factories.deployment(factories.server("s1", slots=3), "m1", load_s=0.05)
        return [factories.request("m1") for _ in range(3)]

    requests = await db(setup)()
    with caplog.at_level(logging.INFO, logger="scheduler.store"):
        await Runtime().run(asyncio.Event(), until_idle=True)
    loads = [r for r in caplog.records if r.getMessage().startswith("loading m1 on s1")]
    assert len(loads) == 1
    for r in requests:
        assert await db(state_of)(r) == State.COMPLETED


async def test_a_model_serving_a_request_is_never_evicted(knobs):
    knobs(MIN_RESIDENCY_S=0, STATUS_SYNC_S=3600)
    upstream = Upstream(["busy"])  # `idle` is not listed yet: the first status sync ignores it
    upstream.gate = threading.Event()
    try:

        def setup():
            srv = factories.server("up", kind="openai", base_url=upstream.url, slots=2)
            factories.deployment(srv, "busy", state=DeploymentState.LOADED)
            factories.deployment(srv, "idle")
            return factories.request("busy")

        first = await db(setup)()
        async with Running() as running:
            assert await asyncio.to_thread(upstream.arrived.wait, 10)
            # The worker's first status sync, begun with the first pass, has its answer.
            await running.until(lambda: Server.objects.get(name="up").last_seen)
            upstream.models.append("idle")
            second = await db(factories.request)("idle")
            await running.passes(3)
            # The only LLM slot on the server is held by a model that is serving: no eviction.
            assert await db(deployment_state)("busy") == DeploymentState.LOADED
            assert await db(deployment_state)("idle") == DeploymentState.UNLOADED
            assert await db(state_of)(second) == State.PENDING
            upstream.gate.set()
            await running.until(lambda: state_of(second) == State.COMPLETED)

        def check():
            first.refresh_from_db()
            idle = Deployment.objects.get(model__name="idle")
            assert first.state == State.COMPLETED
            assert first.finished_at <= idle.loaded_at
            assert deployment_state("busy") == DeploymentState.UNLOADED

        await db(check)()
    finally:
        upstream.close()


async def test_tasks_that_start_together_share_one_adapter():
    """A status sync and a first call ask for a server's adapter at once: they get the
    same one, and no adapter (with its open connections) is built only to be dropped."""
    server = await db(factories.server)("up", kind="openai", base_url="http://127.0.0.1:9")
    runtime = Runtime()
    first, second = await asyncio.gather(
        runtime.effects.adapter(server.pk), runtime.effects.adapter(server.pk)
    )
    assert first is second
    await first.close()


async def test_a_new_request_wakes_an_idle_worker_long_before_its_poll(knobs):
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600, HEARTBEAT_S=3600)
    await db(lambda: factories.deployment(factories.server("s1"), "m1"))()
    async with Running() as running:
        await running.until(lambda: running.runtime.passes >= 1, wake=False)
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
        request = await db(intake.accept)("chat", body)
        # Only the wake-up from intake can explain a pass within the hour.
        await running.until(lambda: state_of(request) == State.COMPLETED, wake=False)


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="LISTEN/NOTIFY needs PostgreSQL")
async def test_a_notify_from_another_connection_wakes_the_worker(knobs):
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600, HEARTBEAT_S=3600)
    await db(lambda: factories.deployment(factories.server("s1"), "m1"))()

    def params() -> dict:
        s = connection.settings_dict
        return {"dbname": s["NAME"], "user": s["USER"], "host": s["HOST"] or "127.0.0.1"}

    def listening() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query = 'LISTEN switchyard'"
            )
            return cursor.fetchone()[0] > 0

    async with Running() as running:
        await running.until(listening, wake=False)
        # Stored without any in-process wake-up; then another connection notifies.
        request = await db(factories.request)("m1")
        with psycopg.connect(**params(), autocommit=True) as other:
            other.execute("SELECT pg_notify('switchyard', '')")
        await running.until(lambda: state_of(request) == State.COMPLETED, wake=False)


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="LISTEN/NOTIFY needs PostgreSQL")
async def test_a_new_request_travels_with_its_notify():
    """The worker hears a new request from another process: its class, so that it can hold
    back what the request may outrank, and its id and model, so that it can send it at
    once. A model name is written as a value (quotes and all); other news carries none. A
    request whose insert stored nothing (no model of its name) wakes no one."""
    heard: asyncio.Queue[wakeup.Arrival | None] = asyncio.Queue()
    listener = asyncio.create_task(wakeup.listen_postgres(heard.put_nowait))

    def notify(arrived: wakeup.Arrival | None) -> None:
        with sql.atomic():
            wakeup.notify_in_transaction(arrived)

    stored = await db(factories.request)("qwen3 'it''s' 8b", Priority.INTERACTIVE)
    arrived = wakeup.Arrival(Priority.INTERACTIVE, stored.pk, "qwen3 'it''s' 8b")
    try:
        assert await asyncio.wait_for(heard.get(), 10) is None  # listening (a guard only)
        await db(notify)(arrived)
        await db(notify)(arrived._replace(request_id=uuid.uuid4()))  # no row: no wake-up
        await db(notify)(None)
        await db(sql.execute)("NOTIFY switchyard, 'by hand'")
        assert [await asyncio.wait_for(heard.get(), 10) for _ in range(3)] == [
            arrived,
            None,
            None,
        ]
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)


def test_run_scheduler_until_idle_processes_everything_and_exits():
    factories.deployment(factories.server("s1", slots=2), "m1")
    requests = [factories.request("m1") for _ in range(3)]
    call_command("run_scheduler", "--until-idle")
    assert {state_of(r) for r in requests} == {State.COMPLETED}
    assert not Worker.objects.exists()


async def test_requests_a_pass_sent_count_as_waiting_no_more():
    def setup():
        factories.deployment(factories.server("s1", slots=1), "m1")
        loaded_on("s1", "m1")
        return [factories.request("m1") for _ in range(2)]

    await db(setup)()
    rt = Runtime()
    await rt.start()
    try:
        await rt.step()  # one slot: one sent, one still waiting
        assert rt.waiting == 1
    finally:
        await rt.stop()


async def test_after_a_pass_only_servers_with_a_waiting_model_call_for_a_pass_when_freed():
    def setup():
        s1, s2 = factories.server("s1", slots=1), factories.server("parked", enabled=False)
        factories.deployment(s1, "m1")
        factories.deployment(s2, "m2")
        loaded_on("s1", "m1")
        factories.request("m1")
        factories.request("m2")  # waits for a server that is off
        return s1.pk, s2.pk

    s1, parked = await db(setup)()
    rt = Runtime()
    await rt.start()
    try:
        await rt.step()  # m1's request sent; m2's waits
        assert (rt.waiting, rt.waiting_for) == (1, {parked})
        assert not rt.plan_after_news(FreedSlot(s1))
    finally:
        await rt.stop()


async def test_a_completion_anywhere_calls_for_a_pass_while_a_quota_holds_a_request():
    """A key held to one request at a time sends m1's request to s1; its m2 request waits
    for the quota, though s2 has a free slot. m1's completion frees the quota: it calls for
    a pass, though s1 holds no model anyone waits for. Without, the m2 request waited for
    the poll interval (5 s) with s2 idle."""

    def setup():
        s1, s2 = factories.server("s1", slots=1), factories.server("s2", slots=1)
        factories.deployment(s1, "m1")
        factories.deployment(s2, "m2")
        loaded_on("s1", "m1")
        loaded_on("s2", "m2")
        key, _ = ApiKey.generate("one-at-a-time", max_processing=1)
        key.save()
        factories.request("m1", api_key=key)
        factories.request("m2", api_key=key)
        return s1.pk, s2.pk

    s1, s2 = await db(setup)()
    rt = Runtime()
    await rt.start()
    try:
        await rt.step()  # m1's request sent; m2's held by the key's quota
        assert (rt.waiting, rt.waiting_for) == (1, {s2})
        assert rt.plan_after_news(FreedSlot(s1))
    finally:
        await rt.stop()


async def test_an_enable_is_followed_by_a_pass_that_serves_what_waited(knobs):
    """An operator enables a disabled server while a request for its model waits: a pass
    follows the intent's and sends it. Without, it waited for the poll interval (5 s; here
    an hour), or the end of its no-server grace."""
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600, NO_SERVER_GRACE_S=3600)

    def setup():
        s1 = factories.server("s1", enabled=False)
        factories.deployment(s1, "m1")
        loaded_on("s1", "m1")
        return s1, factories.request("m1")

    s1, request = await db(setup)()
    async with Running() as running:
        await running.passes(1)  # it waits: no server can serve m1
        # Stored as the web process stores it; its one wake-up is `until`'s.
        await db(Intent.objects.create)(server=s1, action="enable", requested_by="key ops")
        await running.until(lambda: state_of(request) == State.COMPLETED)


async def test_a_pass_that_only_routes_and_sends_goes_to_the_database_thread_once(
    monkeypatch,
):
    """Its snapshot, plan and writes in one trip; a pass that also starts a load, more."""

    def setup():
        factories.deployment(factories.server("s1", slots=4), "m1")
        factories.deployment(factories.server("s2"), "m2")
        loaded_on("s1", "m1")
        return [factories.request("m1") for _ in range(2)]

    sent = await db(setup)()
    trips: list[str] = []

    def counted(fn):
        trips.append(getattr(fn, "__name__", repr(fn)))
        return sync_to_async(fn)

    monkeypatch.setattr("scheduler.runtime.loop.db", counted)
    monkeypatch.setattr("scheduler.runtime.execution.db", counted)
    monkeypatch.setattr("scheduler.runtime.execution.in_database_thread", counted)  # `committed`'s
    rt = Runtime()
    await rt.start()
    try:
        trips.clear()
        routed_and_sent = await rt.step()
        # The serve tasks, started before the pass's commit returns, build their adapter.
        assert [t for t in trips if t != "server_for_adapter"] == ["plan_and_write"]
        assert len(routed_and_sent) == 4  # each request: its Route and its Dispatch
        assert {d.request_id for d in routed_and_sent} == {r.pk for r in sent}

        await db(factories.request)("m2")  # its model must be loaded first
        trips.clear()
        await rt.step()
        assert trips[0] == "plan_and_write" and "start_load" in trips
    finally:
        await rt.stop()


@pytest.mark.parametrize(
    "waiting_for, outcome, wakes",
    [
        (set(), "completed", False),  # nothing to give the freed slot: no pass
        ({1}, "completed", True),  # requests wait for its server: the slot may serve one
        ({2}, "completed", False),  # requests wait only for other servers' models
        (set(), "failed", True),  # a retry or a re-route needs planning
    ],
)
async def test_a_finished_request_wakes_the_loop_only_when_the_plan_may_change(
    waiting_for, outcome, wakes
):
    rt = Runtime()
    rt.waiting_for = waiting_for

    async def serve():
        return FreedSlot(1) if outcome == "completed" else None

    ended = asyncio.Event()
    rt.spawn("serve 1", serve())
    rt.effects.tasks["serve 1"].add_done_callback(lambda _: ended.set())  # runs after the runtime's
    await ended.wait()

    assert rt.wake.is_set() == wakes

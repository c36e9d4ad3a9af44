"""The runtime end to end on simulated servers (and one real OpenAI-compatible upstream):
the life of a request, no head-of-line blocking, parallel loads, one load for all waiters,
no eviction of a busy model, and wake-ups instead of sleeps."""

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from backends.adapters.simulated import SimulatedAdapter, simulated_server
from backends.models import Deployment, DeploymentState, Model, Server
from scheduler import sql, store, wakeup
from scheduler.api import intake
from scheduler.decisions import SendNext, SendOnArrival
from scheduler.models import Priority, Request, State, Worker
from scheduler.runtime import FreedSlot, Runtime
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
LONG_LOAD_S = 600  # a load that never finishes within a test: it is cancelled at the end


def state_of(request: Request) -> str:
    return Request.objects.values_list("state", flat=True).get(pk=request.pk)


def deployment_state(model: str) -> str:
    return Deployment.objects.values_list("state", flat=True).get(model__name=model)


def loaded_on(server_name: str, model: str) -> None:
    Deployment.objects.filter(model__name=model).update(state=DeploymentState.LOADED)
    simulated_server(server_name).loaded.add(model)


async def test_request_travels_from_pending_to_completed_with_its_trace():
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
        assert request.reason["kind"] == "loading"
        assert traces[-1].server == "s1"
        assert request.result["choices"][0]["message"]["content"]
        assert request.routed_at <= request.ready_at <= request.started_at <= request.finished_at
        d = Deployment.objects.get()
        assert (d.state, d.in_flight, d.worker) == (DeploymentState.LOADED, 0, None)
        assert not Worker.objects.exists()  # the worker removed its row on the way out

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
    first, second = await asyncio.gather(runtime.adapter(server.pk), runtime.adapter(server.pk))
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


@contextlib.asynccontextmanager
async def one_slot_in_use():
    """A one-slot server behind a gated upstream, two requests for it, and a worker whose
    first pass sent the first (held at the gate) and planned the second for the slot."""

    def setup() -> list[Request]:
        srv = factories.server("up", kind="openai", base_url=upstream.url, slots=1)
        factories.deployment(srv, "m1", state=DeploymentState.LOADED)
        return [factories.request("m1") for _ in range(2)]

    upstream = Upstream(["m1"])
    upstream.gate = threading.Event()
    try:
        first, second = await db(setup)()
        rt = Runtime()
        await rt.start()
        try:
            await rt.step()
            assert await asyncio.to_thread(upstream.arrived.wait, 10)
            yield rt, upstream, first, second
        finally:
            if not rt.stopping:
                await rt.stop()
    finally:
        upstream.close()


async def _serving_ended(rt: Runtime) -> None:
    """Until no request is at its server (those sent by a completion included)."""
    while serving := [t for name, t in rt.tasks.items() if name.startswith("serve ")]:
        await asyncio.wait_for(asyncio.gather(*serving), 10)  # a guard only


async def test_a_freed_slot_takes_the_planned_request_without_waiting_for_a_pass():
    """One slot, two requests: one pass sends the first and plans the second for the slot.
    The first one's completion sends it; no second pass runs. Breaks if the freed slot
    waited for the loop to wake, snapshot and plan again."""
    async with one_slot_in_use() as (rt, upstream, first, second):
        assert await db(state_of)(second) == State.READY
        upstream.gate.set()
        await _serving_ended(rt)
        assert [await db(state_of)(r) for r in (first, second)] == [State.COMPLETED] * 2
        assert len(upstream.received) == 2


async def test_a_request_that_outranks_the_planned_one_gets_the_freed_slot():
    """The pass planned a normal request for the busy slot; an interactive one arrives
    before the slot frees: the slot waits for the pass that sees it, and it goes first.
    Breaks if the freed slot took the plan made before the arrival."""
    async with one_slot_in_use() as (rt, upstream, _, second):
        body = {"model": "m1", "messages": [{"role": "user", "content": "now"}]}
        urgent = await db(intake.accept)("chat", body, "interactive")
        upstream.gate.set()
        await _serving_ended(rt)
        assert await db(state_of)(second) == State.READY  # the slot waited for a pass
        await rt.step()
        await _serving_ended(rt)

        def started() -> list:
            return [Request.objects.get(pk=r.pk).started_at for r in (urgent, second)]

        sent_urgent, sent_second = await db(started)()
        assert sent_urgent < sent_second


def test_a_plan_read_before_an_arrival_is_held_back_for_it():
    """A request that arrives while a pass plans (after its snapshot, before its plan is in
    place) is not in that plan: the sends it may outrank are dropped as the plan goes in."""
    rt = Runtime()
    far = timezone.now() + timedelta(hours=1)
    background = SendNext(1, uuid.uuid4(), 1, far, Priority.BACKGROUND)
    seen = len(rt.arrivals)  # as the pass reads its snapshot
    rt.news(wakeup.Arrival(Priority.INTERACTIVE, uuid.uuid4(), "m1"))
    rt.install_sends([background], seen)
    assert rt.next_send(1) is None

    rt.install_sends([background], len(rt.arrivals))  # the next pass saw it
    assert rt.next_send(1) == (background.request_id, 1)


async def test_a_stopping_worker_leaves_a_freed_slot_empty(knobs):
    """While it drains, a worker sends nothing new: the planned request waits for a worker
    that stays."""
    knobs(DRAIN_S=10)
    async with one_slot_in_use() as (rt, upstream, first, second):
        stopping = asyncio.create_task(rt.stop())
        # After the stop's first step (the loop runs callbacks in order): it has begun, and
        # waits for the request out.
        asyncio.get_running_loop().call_soon(upstream.gate.set)
        await stopping
        assert [await db(state_of)(r) for r in (first, second)] == [State.COMPLETED, State.READY]
        assert len(upstream.received) == 1


@contextlib.asynccontextmanager
async def idle(rt: Runtime):
    """`rt` after a pass, waiting for news as its loop does between passes; yields that
    wait, done once something calls for a pass."""
    await rt.start()
    waiting = None
    try:
        await rt.step()
        rt.last_sync = time.monotonic()  # no status sync due (STATUS_SYNC_S: a test's)
        # Its first step runs before any wake-up from a thread: they are queued after.
        waiting = asyncio.create_task(rt.wait())
        yield waiting
    finally:
        if waiting is not None:
            waiting.cancel()
        await rt.stop()


@contextlib.asynccontextmanager
async def idle_worker(gated: bool = False, slots: int = 1):
    """An idle worker (`idle`) whose pass found nothing waiting and m1 loaded on a server
    behind a real upstream."""
    upstream = Upstream(["m1"])
    upstream.gate = threading.Event() if gated else None

    def setup() -> None:
        srv = factories.server("up", kind="openai", base_url=upstream.url, slots=slots)
        factories.deployment(srv, "m1", state=DeploymentState.LOADED)

    try:
        await db(setup)()
        rt = Runtime()
        async with idle(rt) as waiting:
            yield rt, upstream, waiting
    finally:
        if upstream.gate is not None:
            upstream.gate.set()
        upstream.close()


async def arrive(model: str = "m1") -> Request:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return await db(intake.accept)("chat", body)


async def _arrivals_sent(rt: Runtime) -> None:
    arriving = [t for name, t in rt.tasks.items() if name.startswith("arrive ")]
    await asyncio.wait_for(asyncio.gather(*arriving), 10)  # a guard only


def reasons(request: Request) -> list[str]:
    return list(request.traces.order_by("pk").values_list("reason", flat=True))


@pytest.mark.parametrize("asked_for", ["m1", "first"])
async def test_a_new_request_goes_straight_to_a_free_slot_without_a_pass(knobs, asked_for):
    """Nothing waits, m1 is loaded with a free slot: a request for it (by its name or an
    alias) is routed and sent as its wake-up comes, where the last pass planned. Breaks if
    it waited for the loop to wake, read a snapshot and plan (the loop is never woken)."""
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600)
    async with idle_worker() as (rt, upstream, waiting):
        await db(lambda: Model.objects.update(aliases=["first"]))()
        request = await arrive(asked_for)
        await _arrivals_sent(rt)
        await _serving_ended(rt)
        assert await db(state_of)(request) == State.COMPLETED
        assert (await db(reasons)(request))[:2] == [
            "model loaded there, sent on arrival",
            "sent to the server",
        ]
        assert not waiting.done() and not rt.wake.is_set()  # no pass was called for
        assert len(upstream.received) == 1


async def test_a_new_request_finding_no_room_left_waits_for_a_pass(knobs):
    """One slot: the first arrival takes it, the second is the next pass's to place. Once
    the first ends, its slot is free for the next arrival again."""
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600)
    async with idle_worker(gated=True) as (rt, upstream, waiting):
        first = await arrive()
        await _arrivals_sent(rt)
        assert await asyncio.to_thread(upstream.arrived.wait, 10)
        second = await arrive()
        await asyncio.wait_for(waiting, 10)  # woken for a pass: a guard only
        assert await db(state_of)(second) == State.PENDING
        upstream.gate.set()
        await _serving_ended(rt)
        assert await db(state_of)(first) == State.COMPLETED
        assert rt.room == {next(iter(rt.slots)): 1}  # the freed slot is the next arrival's
        await rt.step()
        await _serving_ended(rt)
        assert await db(state_of)(second) == State.COMPLETED


async def test_a_send_on_arrival_the_database_refuses_leaves_the_request_to_a_pass(knobs):
    """The model was unloaded behind the worker's back after its plan: the send is refused
    at its lock, the request stays as it came, and a pass is called for."""
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600)
    async with idle_worker() as (rt, upstream, waiting):
        unloaded = DeploymentState.UNLOADED
        await db(lambda: Deployment.objects.update(state=unloaded))()
        request = await arrive()
        await _arrivals_sent(rt)
        await asyncio.wait_for(waiting, 10)  # a guard only
        assert await db(state_of)(request) == State.PENDING
        assert rt.on_arrival == {} and upstream.received == []


async def test_two_idle_workers_send_an_arrival_once(knobs):
    """Both planned the next arrival for the same free slots and both hear of it: the
    database's locks let one send it; the other's send is refused and calls for a pass,
    which finds nothing to do. The upstream sees one call."""
    knobs(POLL_INTERVAL_S=3600, STATUS_SYNC_S=3600)
    other = Runtime()
    async with idle_worker(slots=2) as (rt, upstream, waiting), idle(other) as other_waiting:
        request = await arrive()
        for worker in (rt, other):
            await _arrivals_sent(worker)
            await _serving_ended(worker)
        assert await db(state_of)(request) == State.COMPLETED
        assert len(upstream.received) == 1
        assert [waiting.done(), other_waiting.done()].count(True) == 1
        traced = await db(reasons)(request)
        assert traced[:2] == ["model loaded there, sent on arrival", "sent to the server"]
        assert len(traced) == 3  # and its completion: moved once, sent once


def test_an_arrival_while_a_pass_is_due_or_unseen_by_a_plan_waits_for_a_pass():
    """The pass that is due sees the request (it may outrank others, or need the slot less
    than a waiting one). And a plan whose snapshot was read before an arrival does not
    send the next one: the line it saw empty is not."""
    rt = Runtime()
    planned = SendOnArrival("m1", 1, 1, 1)
    rt.install_sends([planned], 0)
    rt.idle = True
    rt.wake.set()  # a pass is due
    rt.news(wakeup.Arrival(Priority.NORMAL, uuid.uuid4(), "m1"))
    assert rt.arrivals == [(Priority.NORMAL, 0)] and not rt.tasks

    seen = len(rt.arrivals)  # as a pass reads its snapshot
    rt.news(wakeup.Arrival(Priority.NORMAL, uuid.uuid4(), "m2"))
    rt.install_sends([planned], seen)
    assert rt.on_arrival == {}


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


async def test_the_serve_task_starts_in_the_transaction_and_its_call_after_the_commit(
    monkeypatch,
):
    """The locks decide what the commit writes: the serve task starts beside its round
    trip, but the call itself waits for the commit, since a call cannot be taken back
    (tests/scheduler/test_dispatch_commit.py terminates the backend at that moment)."""
    request = await db(_one_loaded_request)()
    serving = threading.Event()
    commits: list[bool] = []
    seen_in_transaction: list[bool] = []
    called_after_commit: list[bool] = []
    real_dispatch, real_serve = store.dispatch_all, Runtime.serve
    real_run = SimulatedAdapter.run

    def dispatch_all(sends, worker_id, routes=None, send_now=None):
        def send_and_watch(jobs):
            transaction.on_commit(lambda: commits.append(True))
            send_now(jobs)
            # The loop starts the task while this thread still holds the transaction.
            seen_in_transaction.append(serving.wait(5) and connection.in_atomic_block)

        return real_dispatch(sends, worker_id, routes, send_and_watch)

    async def serve(self, job, committed):
        serving.set()
        return await real_serve(self, job, committed)

    async def run(self, call):
        called_after_commit.append(commits == [True])
        return await real_run(self, call)

    monkeypatch.setattr(store.dispatch, "dispatch_all", dispatch_all)
    monkeypatch.setattr(Runtime, "serve", serve)
    monkeypatch.setattr(SimulatedAdapter, "run", run)
    await Runtime().run(asyncio.Event(), until_idle=True)

    assert seen_in_transaction == [True]
    assert called_after_commit == [True]
    assert await db(state_of)(request) == State.COMPLETED


async def test_a_send_whose_commit_fails_is_called_off_and_its_request_stays_as_it_was(
    monkeypatch,
):
    request = await db(_one_loaded_request)(stream=True)
    real_dispatch = store.dispatch_all
    published: list[dict] = []
    serving: list = []

    def dispatch_all(sends, worker_id, routes=None, send_now=None):
        def watched(jobs):
            send_now(jobs)
            serving.extend(jobs)

        real_dispatch(sends, worker_id, routes, watched)
        raise psycopg.OperationalError("the database went away before the commit")

    async def publish(group, message):
        published.append(message)

    monkeypatch.setattr(store.dispatch, "dispatch_all", dispatch_all)
    monkeypatch.setattr("scheduler.streams.send", publish)
    rt = Runtime()
    await rt.start()
    try:
        with pytest.raises(psycopg.OperationalError):
            await rt.step()
        tasks = [t for name, t in rt.tasks.items() if name.startswith("serve ")]
        # A guard only: a call left running would wait for its commit for ever.
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert serving and all(t.cancelled() for t in tasks)
    finally:
        await rt.stop()
    assert published == []  # not one chunk of the refused send reached the caller
    assert await db(state_of)(request) == State.PENDING  # where the pass found it


def _one_loaded_request(**fields) -> Request:
    factories.deployment(factories.server("s1"), "m1")
    loaded_on("s1", "m1")
    return factories.request("m1", **fields)


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

    monkeypatch.setattr("scheduler.runtime.db", counted)
    monkeypatch.setattr("scheduler.runtime.in_database_thread", counted)  # `committed`'s
    rt = Runtime()
    await rt.start()
    try:
        trips.clear()
        routed_and_sent = await rt.step()
        # The serve tasks, started before the pass's commit returns, build their adapter.
        assert [t for t in trips if t != "server_by_id"] == ["plan_and_write"]
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
    rt.tasks["serve 1"].add_done_callback(lambda _: ended.set())  # runs after the runtime's
    await ended.wait()

    assert rt.wake.is_set() == wakes

"""The fast paths (scheduler/runtime/fast_paths.py) change when things happen, never what
happens: the same scenarios, run with SWITCHYARD_FAST_PATHS on and off, end the same way.
Each scenario also shows that the fast paths were taken when on, and not when off. Then
each fast path on its own: a freed slot's next send, a send on arrival, a call before its
dispatch commits."""

import asyncio
import contextlib
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.db.models import Min, Q
from django.utils import timezone

from backends.adapters.simulated import SimulatedAdapter
from backends.models import Deployment, DeploymentState, Model, Server
from scheduler import store, wakeup
from scheduler.api import intake
from scheduler.decisions import SendNext, SendOnArrival
from scheduler.models import Priority, Request, State
from scheduler.runtime import Runtime, ServerTasks
from scheduler.runtime.fast_paths import PassArrivals
from scheduler.snapshot import RequestView, Snapshot
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, all_ended, db_thread_closed, one_loaded_request, state_of  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
FAST_REASONS = ("model loaded there, sent on arrival", "sent to the server as a slot freed there")


def loaded_upstream(upstream: Upstream, slots: int) -> None:
    srv = factories.server("up", kind="openai", base_url=upstream.url, slots=slots)
    factories.deployment(srv, "m1", state=DeploymentState.LOADED)


def accept(content: str, priority: str = "normal", stream: bool = False) -> Request:
    body = {"model": "m1", "messages": [{"role": "user", "content": content}], "stream": stream}
    return intake.accept("chat", body, priority)


def outcomes() -> tuple[list, set[str]]:
    """Each request in the order it was first sent: its prompt, state, attempts and answer;
    and the reasons of its trace that only a fast path writes. (The order it was last sent
    in is a matter of timing: a retry's backoff may end before or after a pass.)"""
    rows = []
    fast = set()
    requests = Request.objects.annotate(
        first_sent=Min("traces__at", filter=Q(traces__to_state=State.PROCESSING))
    )
    for r in requests.order_by("first_sent"):
        message = (r.result or {}).get("choices", [{}])[0].get("message", {})
        rows.append(
            (r.payload["messages"][0]["content"], r.state, r.attempts, message.get("content"))
        )
        fast |= {t.reason for t in r.traces.all() if t.reason in FAST_REASONS}
    return rows, fast


def clear() -> None:
    Request.objects.all().delete()
    Deployment.objects.all().delete()
    Server.objects.all().delete()
    Model.objects.all().delete()


async def a_line_on_one_slot(upstream: Upstream) -> None:
    """Four requests of three classes stored before the worker starts, one slot: they go in
    the policy's order, one after the other; the first call fails once and is retried."""
    await db(loaded_upstream)(upstream, 1)
    upstream.fail_next = [(500, "once")]
    for content, priority in [("a", "normal"), ("b", "background"), ("c", "interactive")]:
        await db(accept)(content, priority)
    await db(accept)("d", "normal", stream=True)
    async with Running() as running:
        await running.until(all_ended)


async def arrivals_at_an_idle_worker(upstream: Upstream) -> None:
    """A worker with nothing to do; requests arrive one at a time, each answered before the
    next."""
    await db(loaded_upstream)(upstream, 2)
    async with Running() as running:
        await running.until(all_ended)  # its first pass: nothing waits
        for content in ["e", "f", "g"]:
            await db(accept)(content, stream=content == "f")
            await running.until(all_ended, wake=False)  # the request's own wake-up only


@pytest.mark.parametrize(
    "scenario, fast_paths",
    [(a_line_on_one_slot, {FAST_REASONS[1]}), (arrivals_at_an_idle_worker, {FAST_REASONS[0]})],
)
async def test_the_same_scenario_ends_the_same_with_fast_paths_on_and_off(
    knobs, scenario, fast_paths
):
    knobs(RETRY_BASE_S=0.01, RETRY_MAX_S=0.01)
    ended = {}
    for on in (True, False):
        knobs(FAST_PATHS=on)
        upstream = Upstream(["m1"])
        try:
            await scenario(upstream)
        finally:
            upstream.close()
        rows, taken = await db(outcomes)()
        assert taken == (fast_paths if on else set()), on
        ended[on] = (rows, len(upstream.received))
        await db(clear)()
    assert ended[True] == ended[False]


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
    while serving := [t for name, t in rt.effects.tasks.items() if name.startswith("serve ")]:
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
    seen = len(rt.fast.arrivals)  # as the pass reads its snapshot
    rt.news(wakeup.Arrival(Priority.INTERACTIVE, uuid.uuid4(), "m1"))
    rt.fast.install([background], seen, {})
    assert rt.fast.next_send(1) is None

    rt.fast.install([background], len(rt.fast.arrivals), {}, plan=7)  # the next pass saw it
    assert rt.fast.next_send(1) == store.PlannedSend(
        background.request_id, 1, Priority.BACKGROUND, 0, 7
    )


def view(priority: int, api_key: int | None, state: str = State.PENDING) -> RequestView:
    now = timezone.now()
    return RequestView(uuid.uuid4(), "m1", priority, state, now, now, api_key=api_key)


def snapshot_of(*requests: RequestView) -> Snapshot:
    return Snapshot(servers=(), deployments=(), requests=requests)


def test_a_send_planned_before_a_pass_saw_an_arrival_is_not_made_if_it_may_go_first():
    """The loop hears of an arrival by its wake-up, which can come after a pass has read the
    request (and routed it). A slot freeing meanwhile must not go to the older plan's
    choice if the new request may go before it: a better class, or its class and another
    key (fair share). The check is made where the answer is written (the database
    thread), against what the passes read."""
    arrivals = PassArrivals()
    waiting = view(Priority.NORMAL, 1)
    plan = arrivals.read(snapshot_of(waiting))  # the pass that planned the send
    flooders = store.PlannedSend(uuid.uuid4(), 1, Priority.NORMAL, 1, plan)
    assert not arrivals.outranked(flooders)
    # The next pass sees the same request still waiting, and one of the flooder's own:
    # neither is new news against the plan's choice.
    arrivals.read(snapshot_of(waiting, view(Priority.NORMAL, 1)))
    assert not arrivals.outranked(flooders)
    # Then one of another key, same class: fair share may send it first.
    trickler = view(Priority.NORMAL, 2)
    later = arrivals.read(snapshot_of(waiting, trickler))
    assert arrivals.outranked(flooders)
    # A plan made from that pass on knows it: nothing newer outranks its choice.
    assert not arrivals.outranked(flooders._replace(plan=later))
    # Routed already (ready), a request is no arrival; of a worse class, it never outranks.
    arrivals.read(snapshot_of(view(Priority.BACKGROUND, 2), view(Priority.HIGH, 1, "ready")))
    assert not arrivals.outranked(flooders._replace(plan=later))
    interactive = store.PlannedSend(uuid.uuid4(), 1, Priority.INTERACTIVE, 1, plan)
    assert not arrivals.outranked(interactive)


async def test_a_freed_slot_is_left_to_the_next_pass_when_a_pass_saw_a_request_go_first():
    """The second request is planned for the slot; then a pass reads a request of another
    key, same class, that the loop has not heard of (its wake-up not in yet). The first
    one's answer is written without sending the second: the next pass decides the slot."""
    async with one_slot_in_use() as (rt, upstream, first, second):
        await db(rt.pass_arrivals.read)(snapshot_of(view(Priority.NORMAL, 2)))
        upstream.gate.set()
        await _serving_ended(rt)
        assert [await db(state_of)(r) for r in (first, second)] == [State.COMPLETED, State.READY]
        await rt.step()  # the next pass: here, nothing else waits in the database
        await _serving_ended(rt)
        assert await db(state_of)(second) == State.COMPLETED


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
        rt.server_tasks.last_sync = time.monotonic()  # no status sync due (STATUS_SYNC_S: a test's)
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
    arriving = [t for name, t in rt.effects.tasks.items() if name.startswith("arrive ")]
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
        assert rt.fast.room == {
            next(iter(rt.fast.slots)): 1
        }  # the freed slot is the next arrival's
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
        assert rt.fast.on_arrival == {} and upstream.received == []


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
    rt.fast.install([planned], 0, {})
    rt.idle = True
    rt.wake.set()  # a pass is due
    rt.news(wakeup.Arrival(Priority.NORMAL, uuid.uuid4(), "m1"))
    assert rt.fast.arrivals == [(Priority.NORMAL, 0)] and not rt.effects.tasks

    seen = len(rt.fast.arrivals)  # as a pass reads its snapshot
    rt.news(wakeup.Arrival(Priority.NORMAL, uuid.uuid4(), "m2"))
    rt.fast.install([planned], seen, {})
    assert rt.fast.on_arrival == {}


async def test_the_serve_task_starts_in_the_transaction_and_its_call_after_the_commit(
    monkeypatch,
):
    """The locks decide what the commit writes: the serve task starts beside its round
    trip, but the call itself waits for the commit, since a call cannot be taken back
    (tests/scheduler/test_dispatch_commit.py terminates the backend at that moment)."""
    request = await db(one_loaded_request)()
    serving = threading.Event()
    commits: list[bool] = []
    seen_in_transaction: list[bool] = []
    called_after_commit: list[bool] = []
    real_dispatch, real_serve = store.dispatch_all, ServerTasks.serve
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
    monkeypatch.setattr(ServerTasks, "serve", serve)
    monkeypatch.setattr(SimulatedAdapter, "run", run)
    await Runtime().run(asyncio.Event(), until_idle=True)

    assert seen_in_transaction == [True]
    assert called_after_commit == [True]
    assert await db(state_of)(request) == State.COMPLETED


async def test_a_send_whose_commit_fails_is_called_off_and_its_request_stays_as_it_was(
    monkeypatch,
):
    request = await db(one_loaded_request)(stream=True)
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
        tasks = [t for name, t in rt.effects.tasks.items() if name.startswith("serve ")]
        # A guard only: a call left running would wait for its commit for ever.
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert serving and all(t.cancelled() for t in tasks)
    finally:
        await rt.stop()
    assert published == []  # not one chunk of the refused send reached the caller
    assert await db(state_of)(request) == State.PENDING  # where the pass found it

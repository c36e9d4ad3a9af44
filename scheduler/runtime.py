"""The imperative shell: read a snapshot, ask the policy, carry out its decisions.

One loop owns the bookkeeping. Loads, unloads, requests and probes run as named asyncio tasks
that report back through the database and wake the loop; the loop never waits for them.
"""

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from backends.adapters.base import Adapter, AdapterError, ErrorCode
from backends.adapters.registry import adapter_for, settings_of
from backends.models import Health, Server
from config import event_loop

from . import announce, conflicts, faults, retention, store, streams, wakeup
from .batching import Batcher
from .database_thread import in_database_thread
from .decisions import (
    Decision,
    Defer,
    Dispatch,
    Expire,
    Fail,
    MarkReady,
    Probe,
    Requeue,
    Route,
    SendNext,
    SendOnArrival,
    StartLoad,
    Unload,
)
from .intents import Intents
from .models import WAITING_STATES, State
from .policy import plan_explained
from .pool_threads import released
from .reasons import Reason
from .snapshot import Snapshot
from .transitions import Transition
from .wakeup import Arrival
from .webhooks import Webhooks

log = logging.getLogger(__name__)
T = TypeVar("T")


def db(fn: Callable[..., T]) -> Callable[..., Coroutine[Any, Any, T]]:
    """`fn` in the database thread, run again should it lose a lock conflict."""
    return in_database_thread(conflicts.retried(fn))


PURGE_EVERY_S = 300.0  # between looks for finished requests to delete, when none were due
MAX_REPLANS = 3  # passes in a row planned again at once because the database refused some


class FreedSlot(NamedTuple):
    """What a request's completion returns: the plan changes only if a request waits that
    this server's freed slot could serve."""

    server_id: int


class SentOnArrival(NamedTuple):
    """What a new request's send on arrival returns: it went where the last pass planned,
    which that plan foresaw (no news)."""

    request_id: Any


class Runtime:
    def __init__(self, clock: Callable[[], datetime] = timezone.now) -> None:
        self.clock = clock
        self.worker_id: int | None = None
        self.adapters: dict[int, Adapter] = {}
        self.built_from: dict[int, tuple] = {}  # server → the settings its adapter has
        self.retired: list[Adapter] = []  # replaced after an edit; closed at stop
        self.tasks: dict[str, asyncio.Task] = {}
        self.chores: set[asyncio.Future] = set()  # DB writes no task waits for to the end
        self.completions = Batcher(self.write_completions, self.chores)
        self.arrival_sends = Batcher(self.write_arrival_sends, self.chores)
        # Per server, what the last pass planned for its slots as they free (`SendNext`),
        # and the classes of the requests that arrived since it was installed.
        self.next_sends: dict[int, list[SendNext]] = {}
        self.arrivals: list[tuple[int, int]] = []  # (class, API key) of each arrival
        # With nothing waiting, where the last pass planned to send each model's next arrival,
        # and the free slots it saw per server, counted down by those sends and up as
        # requests there end (`SendOnArrival`).
        self.on_arrival: dict[str, SendOnArrival] = {}
        self.room: dict[int, int] = {}
        self.slots: dict[int, int] = {}  # server → slots, as of the last snapshot
        self.idle = False  # the loop waits for news: no pass is under way or due
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_context: contextvars.Context | None = None
        self.wake = asyncio.Event()
        self.next_wake: datetime | None = None
        self.knobs = settings.SWITCHYARD
        self.config = store.policy_config()
        self.snapshots = store.SnapshotReader()
        self.reasons = store.ReasonWriter()  # why each request waits, stored as it changes
        self.pass_reasons: Mapping[Any, Reason] = {}
        self.last_sync = -float("inf")
        self.next_purge = -float("inf")
        self.waiting = 0  # requests still waiting after the last pass (of those it saw)
        self.waiting_for: set[int] = set()  # servers with a deployment of a waiting model
        self.server_of: dict[int, int] = {}  # deployment → server, as of the last snapshot
        self.marked_up: dict[int, float] = {}  # server → when an answer last marked it up
        self.to_mark_up: set[int] = set()  # servers whose answer's mark waits for the pass
        self.dropped = 0  # decisions of the last pass that the database refused
        self.crashed: BaseException | None = None
        self.until_idle = False
        # For tests and embedders: `passes` counts finished passes, `quiet_ends` the tasks
        # whose end called for none; `passed` is notified after each of either, so a caller
        # can await a fact instead of sleeping.
        self.passes = 0
        self.quiet_ends = 0
        self.heartbeats = 0  # leases renewed (tests wait on this one instead of time)
        self.passed = asyncio.Condition()
        self.intents = Intents(self)  # operators' wishes, carried out after each pass

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_context = contextvars.copy_context()
        await announce.open_outbox()
        self.worker_id = await db(store.register_worker)()
        wakeup.subscribe(self.news)
        await self.take_over()
        loop = event_loop.name(self.loop)
        log.info("worker %s started on %s's event loop", self.worker_id, loop)

    async def take_over(self) -> bool:
        """Take back work from stale workers and re-check loads that nobody holds. True if
        anything was taken."""
        stale_s = self.knobs["WORKER_STALE_S"]
        moved, recheck = await db(store.take_over_stale_workers)(stale_s, self.worker_id)
        for deployment_id in recheck:
            await self.recheck(deployment_id)
        return bool(moved or recheck)

    async def stop(self) -> None:
        """Stop cleanly: let requests already at their servers finish (up to DRAIN_S), cancel
        the other tasks, then hand back what this worker held so that any worker (this one,
        restarted, or another) runs it again."""
        wakeup.unsubscribe(self.news)
        self.stopping = True  # a slot freed now stays free: this worker sends no more
        await self.drain()
        for task in self.tasks.values():
            task.cancel()
        self.write_marks()  # of the answers while draining
        await asyncio.gather(*self.tasks.values(), *self.chores, return_exceptions=True)
        if self.worker_id is not None:
            try:
                _, recheck = await db(store.release_worker)(self.worker_id)
            except faults.DATABASE_FAULTS as error:  # handed back once it answers (`restarts`)
                log.info("worker %s could not hand back its work: %r", self.worker_id, error)
                recheck = []
            for deployment_id in recheck:
                await self.recheck(deployment_id)
        for adapter in [*self.adapters.values(), *self.retired]:
            await adapter.close()
        await db(close_old_connections)()  # the DB thread outlives the worker
        await announce.close_outbox()
        log.info("worker %s stopped", self.worker_id)

    async def drain(self) -> None:
        serving = [task for name, task in self.tasks.items() if name.startswith("serve ")]
        drain_s = self.knobs["DRAIN_S"]
        if not serving or drain_s <= 0:
            return
        log.info(
            "worker %s draining: %d request(s) at their servers, waiting up to %.0f s",
            self.worker_id,
            len(serving),
            drain_s,
        )
        # Its lease is kept while it drains: else a drain longer than the stale time hands
        # what is still running to another worker, and it runs twice.
        lease = asyncio.create_task(self.keep_lease(), name="lease while draining")
        try:
            _, unfinished = await asyncio.wait(serving, timeout=drain_s)
        finally:
            lease.cancel()
            await asyncio.gather(lease, return_exceptions=True)
        if unfinished:
            log.warning(
                "%d request(s) did not finish within %.0f s; they will run again",
                len(unfinished),
                drain_s,
            )

    async def keep_lease(self) -> None:
        while True:
            await db(store.heartbeat)(self.worker_id)
            self.heartbeats += 1
            await asyncio.sleep(self.knobs["HEARTBEAT_S"])

    async def run(self, stop: asyncio.Event, until_idle: bool = False) -> None:
        """Plan and execute until `stop` is set, or with `until_idle` until no request waits
        and nothing is left to do."""
        self.until_idle = until_idle
        await self.start()
        side = [
            asyncio.create_task(self.heartbeat(stop), name="heartbeat"),
            asyncio.create_task(self.wake_on(stop), name="stop"),
            asyncio.create_task(Webhooks(self).run(), name="webhooks"),
        ]
        if settings.IS_POSTGRES:
            side.append(asyncio.create_task(wakeup.listen_postgres(self.news), name="listen"))
        for task in side:
            task.add_done_callback(self.side_task_done)
        replans = 0
        try:
            while not stop.is_set():
                self.wake.clear()
                await self.sync_status_if_due()
                did = await self.step()
                self.write_marks()
                await self.count_pass()
                if self.crashed:
                    raise self.crashed  # as it came: a lost database ends `run_scheduler` cleanly
                if until_idle and not did and not self.tasks and not self.waiting:
                    break
                # A plan covers everything it can see, so after a pass that went as planned
                # only news (an arrival, a finished task, a due moment) can bring more work.
                # A dropped decision means the rows moved under us: plan again at once (a
                # few times; a refusal that persists must not spin the loop).
                replan = self.dropped and replans < MAX_REPLANS
                replans = replans + 1 if replan else 0
                if not replan and not (did and until_idle):
                    await self.wait()
        finally:
            for task in side:
                task.remove_done_callback(self.side_task_done)
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            await self.stop()

    async def count_pass(self) -> None:
        async with self.passed:
            self.passes += 1
            self.passed.notify_all()

    async def count_quiet_end(self) -> None:
        async with self.passed:
            self.quiet_ends += 1
            self.passed.notify_all()

    def news(self, arrived: Arrival | None) -> None:
        """Something to plan for (`arrived`: a new request). A new request goes at once
        where the last pass planned its model's next arrival, if it can (`send_on_arrival`).
        Else it may outrank what that pass planned for the slots that free next: those it
        could outrank wait for the pass that sees it."""
        self.intents.news(arrived)
        if arrived is not None:
            if self.send_on_arrival(arrived):
                return
            self.arrivals.append((arrived.priority, arrived.api_key))
            self.hold_back_for(arrived.priority, arrived.api_key)
        self.wake.set()

    def send_on_arrival(self, arrived: Arrival) -> bool:
        """Send a new request where the last pass planned its model's next arrival: only
        while the loop is idle (a pass under way or due must see the request first) and the
        server has room. False if it is left to a pass."""
        planned = self.on_arrival.get(arrived.model)
        if planned is None or not self.idle or self.wake.is_set() or self.stopping:
            return False
        if self.room.get(planned.server_id, 0) <= 0:
            return False
        self.room[planned.server_id] -= 1
        self.spawn(f"arrive {arrived.request_id}", self.arrive(arrived.request_id, planned))
        return True

    async def arrive(self, request_id: Any, planned: SendOnArrival) -> SentOnArrival | None:
        """Route and send a new request as planned (with those arriving meanwhile, in one
        transaction). None, and the next pass decides, if the database refused it: the slot
        or the model gone, or the request taken by another worker."""
        reason = "model loaded there, sent on arrival"
        route = Route(request_id, planned.deployment_id, True, reason)
        if not await self.arrival_sends.submit(route):
            self.on_arrival.clear()
            return None
        return SentOnArrival(request_id)

    async def write_arrival_sends(self, routes: list[Route]) -> list[bool]:
        moves = [self.transition_for(r) for r in routes]
        sends = [(r.request_id, r.deployment_id) for r in routes]
        jobs = await self.committed(
            lambda send_now: store.send_on_arrival(moves, sends, self.worker_id, send_now)
        )
        return [job is not None for job in jobs]

    def hold_back_for(self, arrived: int, api_key: int = 0) -> None:
        """Drop the planned sends that a new request of class `arrived` may outrank: of a
        worse class, or of its class and another API key's (fair share)."""
        for planned in self.next_sends.values():
            planned[:] = [
                n
                for n in planned
                if n.effective_priority < arrived
                or (n.effective_priority == arrived and (n.api_key or 0) == api_key)
            ]

    def side_task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception():
            log.error("side task %s crashed: %r", task.get_name(), task.exception())
            self.crashed = task.exception()
            self.wake.set()

    async def wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.wake.set()

    async def wait(self) -> None:
        """Until woken (a stop wakes the loop too) or the next planned moment: a deferred
        decision, a status sync, or the poll interval (the safety net). One timer, no task:
        this runs before every pass."""
        timeout = self.knobs["POLL_INTERVAL_S"]
        next_sync = self.last_sync + self.knobs["STATUS_SYNC_S"] - time.monotonic()
        timeout = min(timeout, max(next_sync, 0.0))
        if self.next_wake is not None:
            timeout = min(timeout, max((self.next_wake - self.clock()).total_seconds(), 0.0))
        self.idle = True
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()
        finally:
            self.idle = False

    async def heartbeat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            beat = await db(store.heartbeat)(self.worker_id)
            self.heartbeats += 1
            if not beat:
                # Another worker found our heartbeat stale (a stalled DB?) and took our work.
                # What we still run finishes into nothing: its row refuses our old id.
                old, self.worker_id = self.worker_id, await db(store.register_worker)()
                log.warning("worker %s was taken over; carrying on as %s", old, self.worker_id)
                continue
            await asyncio.sleep(self.knobs["HEARTBEAT_S"])
            if await self.take_over():
                self.wake.set()
            await self.purge_if_due()

    async def purge_if_due(self) -> None:
        """Delete a batch of requests finished past their keeping time: at each heartbeat
        while a backlog lasts, else every PURGE_EVERY_S (outside the pass's thread)."""
        if time.monotonic() < self.next_purge:
            return
        purged = await released(retention.purge_due)(batches=1)
        pause = 0.0 if purged == retention.BATCH else PURGE_EVERY_S
        self.next_purge = time.monotonic() + pause

    # -- one pass ------------------------------------------------------------------------

    async def step(self) -> list[Decision]:
        """One snapshot, plan and execute pass. Returns what it did (Defer excluded)."""
        snapshot, decisions, first = await self.committed(self.plan_and_write)
        self.next_wake = None
        done: list[Decision] = []
        self.dropped = 0

        def record(decision: Decision, ok: bool) -> None:
            if ok:
                done.append(decision)
            elif not isinstance(decision, Defer | Probe):  # a probe still out is no news
                self.dropped += 1

        def finish(written: Batch) -> None:
            for decision, ok in written.results:
                record(decision, ok)

        finish(first)
        batch = Batch(self)
        for decision in decisions[first.size :]:
            if batch.add(decision):
                continue
            if batch.size:
                finish(await self.committed(batch.write))
                batch = Batch(self)
            if not batch.add(decision):
                record(decision, await self.execute(decision))
        if batch.size:
            finish(await self.committed(batch.write))
        # Why the requests left waiting wait: stored where it changed, after the moves.
        if changed := self.reasons.changed(self.pass_reasons):
            await db(store.write_reasons)(changed)
        # Those it sent or ended wait no more: their completion alone calls for no pass.
        ended = {d.request_id for d in done if isinstance(d, Dispatch | Expire | Fail)}
        models = {r.model for r in snapshot.requests if r.id not in ended}
        self.waiting = len(snapshot.requests) - len(ended)
        self.waiting_for = {d.server_id for d in snapshot.deployments if d.model in models}
        await self.intents.after_pass(snapshot)
        return done

    def plan_and_write(self, send_now: store.Sending) -> tuple[Snapshot, list[Decision], "Batch"]:
        """In the database thread: read the snapshot, plan, and write the plan's leading
        request moves and sends (most passes are only those): one trip to the thread, not
        two. The plan's `SendNext` replace the last pass's at once: a slot may free before
        this pass's writes are done."""
        arrivals_seen = len(self.arrivals)  # those after may be missing from the snapshot
        snapshot = self.snapshots.read(self.config)
        self.server_of = {d.id: d.server_id for d in snapshot.deployments}
        self.slots = {s.id: s.slots for s in snapshot.servers}
        planned = plan_explained(snapshot, self.clock())
        decisions = planned.decisions
        later = [d for d in decisions if isinstance(d, SendNext | SendOnArrival)]
        decisions = [d for d in decisions if not isinstance(d, SendNext | SendOnArrival)]
        self.call_on_loop(self.install_sends, later, arrivals_seen)
        batch = Batch(self)
        for decision in decisions:
            if not batch.add(decision):
                break
        self.pass_reasons = planned.reasons
        return snapshot, decisions, batch.write(send_now) if batch.size else batch

    def install_sends(self, planned: list[SendNext | SendOnArrival], arrivals_seen: int) -> None:
        """Install a pass's plan for the slots that free and the requests that arrive, held
        back for the requests that arrived after its snapshot was read (their own pass is
        coming): the line it saw empty is not."""
        missed, self.arrivals = self.arrivals[arrivals_seen:], []
        self.next_sends, self.on_arrival, self.room = {}, {}, {}
        for p in planned:
            if isinstance(p, SendNext):
                self.next_sends.setdefault(p.server_id, []).append(p)
            elif not missed:
                self.on_arrival[p.model] = p
                self.room[p.server_id] = p.room
        for priority, api_key in set(missed):
            self.hold_back_for(priority, api_key)

    def next_send(self, server_id: int) -> tuple[Any, int] | None:
        """The request planned for the slot that just freed on the server, if any is still
        due: taken from every server's plan (it is sent once)."""
        if self.stopping:
            return None
        planned = self.next_sends.get(server_id)
        now = self.clock()
        while planned:
            n = planned.pop(0)
            if n.expires_at > now:
                for others in self.next_sends.values():
                    others[:] = [o for o in others if o.request_id != n.request_id]
                return n.request_id, n.deployment_id
        return None

    def call_on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """From the database thread, in the loop's context, not this thread's: the tasks it
        starts belong to the loop, whatever context the thread runs in."""
        assert self.loop is not None and self.loop_context is not None
        self.loop.call_soon_threadsafe(callback, *args, context=self.loop_context)

    async def committed(self, write: Callable[[store.Sending], T]) -> T:
        """Run a write in the database thread that may send requests: given a `send_now`,
        it hands over the jobs as soon as their rows' and slots' locks are held, and their
        serve tasks start at once (an adapter is ready by the commit), but each call to its
        server waits for the commit: a call cannot be taken back, and should the commit fail
        or its outcome be unknown (the database went away), the request is sent again. The
        tasks are then cancelled before they call anyone."""
        for attempt in range(conflicts.ATTEMPTS):
            commit = asyncio.Event()
            tasks: list[asyncio.Task] = []

            def start_serving(jobs: list[store.ServeJob], commit=commit, tasks=tasks) -> None:
                for job in jobs:
                    tasks.append(self.spawn(f"serve {job.request_id}", self.serve(job, commit)))

            try:
                result = await in_database_thread(write)(
                    lambda jobs: self.call_on_loop(start_serving, jobs)
                )
            except BaseException as error:
                # The calls it started came back to the loop before its outcome did.
                for task in tasks:
                    task.cancel()
                last = attempt == conflicts.ATTEMPTS - 1
                if last or not isinstance(error, Exception) or not conflicts.is_conflict(error):
                    raise
                # Rolled back whole, its calls called off: written again, as if for the first
                # time (a pass reads and plans again).
                log.info("a write lost a lock conflict with another worker; again (%s)", error)
                await asyncio.sleep(conflicts.pause(attempt))
                continue
            commit.set()
            return result
        raise AssertionError("unreachable")

    async def write_completions(self, answers: list[store.Answer]) -> list[bool]:
        return await self.committed(lambda send_now: store.requests_completed(answers, send_now))

    def transition_for(self, decision: Decision) -> Transition | None:
        """The request transition that carries out `decision`, if that is all it takes."""
        match decision:
            case Expire(request_id=rid, reason=reason):
                fields = {"error": f"expired: {reason}", "error_code": "expired"}
                return Transition(rid, WAITING_STATES, State.EXPIRED, reason, fields)
            case Fail(request_id=rid, code=code, message=message):
                fields = {"error": message, "error_code": code}
                return Transition(rid, WAITING_STATES, State.FAILED, message, fields)
            case Route(request_id=rid, deployment_id=did, ready=ready, reason=reason):
                now = timezone.now()
                fields = {"deployment_id": did, "routed_at": now, "server_id": self.server_of[did]}
                if ready:
                    fields["ready_at"] = now
                to = State.READY if ready else State.NEEDS_LOADING
                return Transition(rid, (State.PENDING,), to, reason, fields)
            case Requeue(request_id=rid, reason=reason):
                fields = {"deployment": None, "server": None}
                return Transition(
                    rid, (State.NEEDS_LOADING, State.READY), State.PENDING, reason, fields
                )
            case MarkReady(request_id=rid):
                fields = {"ready_at": timezone.now()}
                return Transition(
                    rid, (State.NEEDS_LOADING,), State.READY, "its model is loaded", fields
                )
        return None

    async def execute(self, decision: Decision) -> bool:
        """Carry out a decision that is more than a request transition; False when it was
        dropped (the row moved meanwhile)."""
        match decision:
            case Defer(until=until):
                self.next_wake = until if self.next_wake is None else min(self.next_wake, until)
                return False
            case StartLoad(deployment_id=did, evict=evict, reason=reason):
                job = await db(store.start_load)(did, evict, self.worker_id, reason)
                if job is None:
                    return False
                self.spawn(f"load {job.model_name}@{job.server_name}", self.load(job))
                return True
            case Unload(deployment_id=did, reason=reason):
                target = await db(store.start_unload)(did, self.worker_id)
                if target is None:
                    return False
                self.spawn(f"unload {did}", self.unload(did, *target, reason))
                return True
            case Probe(server_id=sid):
                name = f"probe {sid}"
                if name in self.tasks:  # one probe decides; it is still out
                    return False
                self.spawn(name, self.probe(sid))
                return True
        raise TypeError(f"unknown decision {decision!r}")

    def calls_for_pass(self, ended: object) -> bool:
        """Whether a task's end (what it returned) calls for a pass."""
        if isinstance(ended, SentOnArrival):
            return self.until_idle
        return not isinstance(ended, FreedSlot) or self.plan_after_news(ended)

    def plan_after_news(self, freed: FreedSlot) -> bool:
        """Whether a request that completed calls for a pass: only if a request was waiting
        at the last one for a model deployed on its server (only those can take the freed
        slot, or have that server load their model once it is idle; a deep line for models
        elsewhere is not replanned on every completion), or to notice idleness. A new
        arrival wakes the loop by itself."""
        return freed.server_id in self.waiting_for or self.until_idle

    def spawn(self, name: str, coro) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self.tasks[name] = task

        def finished(t: asyncio.Task) -> None:
            self.tasks.pop(name, None)
            if not t.cancelled() and t.exception():
                # Its rows (a request processing, a load under way) would stay held by a
                # worker that is alive: the worker stops instead, and hands them back.
                crash = t.exception()
                if not faults.is_database_fault(crash):
                    log.error("task %s crashed; the worker stops", name, exc_info=crash)
                elif self.crashed is None:  # the database's fault: said once, by `restarts`
                    log.info("task %s met a database fault; the worker stops", name)
                self.crashed = self.crashed or crash
            elif not t.cancelled() and not self.calls_for_pass(t.result()):
                self.write_marks()  # no pass comes to write them after
                self.chore(self.count_quiet_end())
                return
            self.wake.set()

        task.add_done_callback(finished)
        return task

    # -- tasks ---------------------------------------------------------------------------

    async def adapter(self, server_id: int) -> Adapter:
        if server_id not in self.adapters:
            server = await db(store.server_by_id)(server_id)
            # Tasks that start together (a status sync, a first call) all come here: one
            # builds the adapter, the others use it (one replaced would never be closed).
            if server_id not in self.adapters:
                self.adapters[server_id] = adapter_for(server)
                self.built_from[server_id] = settings_of(server)
        return self.adapters[server_id]

    def retire_stale_adapter(self, server: Server) -> None:
        """An operator's edit (URL, key, kind, …) reaches the worker with the next status
        sync: the next task builds a new adapter. Requests still on the old one finish
        there; it is closed when the worker stops."""
        if server.pk in self.adapters and self.built_from[server.pk] != settings_of(server):
            log.info("server %s was edited: connecting anew", server.name)
            self.retired.append(self.adapters.pop(server.pk))

    async def load(self, job: store.LoadJob) -> None:
        adapter = await self.adapter(job.server_id)
        started = time.monotonic()
        last_report = 0.0

        def progress(fraction: float) -> None:
            nonlocal last_report
            if time.monotonic() - last_report >= 0.5 or fraction >= 1.0:
                last_report = time.monotonic()
                self.chore(db(store.set_load_progress)(job.deployment_id, fraction))

        try:
            await self.evict(adapter, job)
            async with asyncio.timeout(job.target.timeout_s):
                await adapter.load(job.target, progress)
        except TimeoutError:
            message = f"load timed out after {job.target.timeout_s:.0f} s"
            await self.load_failed(job, AdapterError(ErrorCode.LOAD_FAILED, message))
            await self.unload_quietly(adapter, job.target.server_model_id)
        except AdapterError as error:
            await self.load_failed(job, error)
        except Exception as exc:  # an adapter bug must not leave the deployment `loading`
            log.exception("loading %s crashed", job.model_name)
            await self.load_failed(job, AdapterError(ErrorCode.LOAD_FAILED, repr(exc)))
        else:
            await db(store.load_succeeded)(job, time.monotonic() - started)
            self.server_answered(job.server_id)

    async def evict(self, adapter: Adapter, job: store.LoadJob) -> None:
        """Unload the victims first. One that fails to unload is re-checked with the server,
        so it never stays `unloading`, and the load counts as failed."""
        for victim_id, server_model_id in job.evict:
            try:
                await adapter.unload(server_model_id)
            except AdapterError:
                for left_id, _ in job.evict:
                    await self.recheck(left_id, held_by=job.worker_id)
                raise
            await db(store.evicted)(victim_id, to_make_room=True)

    async def unload_quietly(self, adapter: Adapter, server_model_id: str) -> None:
        """After a timed-out load, ask the server to drop what it may still be loading."""
        try:
            await adapter.unload(server_model_id)
        except AdapterError as error:
            log.info("could not unload %s after its load timed out: %s", server_model_id, error)

    async def load_failed(self, job: store.LoadJob, error: AdapterError) -> None:
        self.forget_answers(job.server_id)
        await db(store.load_failed)(job, error)
        if error.server_fault:
            await db(store.server_failed)(job.server_id, error.message)
        self.sync_soon(job.server_id)

    async def unload(self, deployment_id: int, server_id: int, model_id: str, why: str) -> None:
        adapter = await self.adapter(server_id)
        try:
            await adapter.unload(model_id)
        except AdapterError as error:
            log.warning("unloading %s failed: %s", model_id, error.message)
            await self.recheck(deployment_id, held_by=self.worker_id)
            return
        log.info("unloaded %s (%s)", model_id, why)
        await db(store.evicted)(deployment_id)

    async def serve(self, job: store.ServeJob, committed: asyncio.Event) -> FreedSlot | None:
        adapter = await self.adapter(job.server_id)
        # A call cannot be taken back: it waits for its dispatch's commit. Should that fail,
        # or its outcome be unknown, the request is sent again, and must not have run.
        await committed.wait()
        started = time.monotonic()
        relay = streams.Relay(job.request_id, committed)
        try:
            if job.call.stream:
                result = await relay.run(adapter.stream(job.call))
            else:
                result = await adapter.run(job.call)
        except AdapterError as error:
            await self.serve_failed(job, error, may_retry=not relay.sent)
            return
        except Exception as exc:  # an adapter bug must not leave the request `processing`
            log.exception("request %s crashed in its adapter", job.request_id)
            error = AdapterError(ErrorCode.SERVER_ERROR, repr(exc))
            await self.serve_failed(job, error, may_retry=False)
            return
        seconds = time.monotonic() - started
        then_send = self.next_send(job.server_id)
        answer = store.Answer(job, result, seconds, then_send)
        if not await self.completions.submit(answer):
            log.warning(
                "request %s finished after it was taken over; result dropped", job.request_id
            )
        elif then_send is None and job.server_id in self.room:
            # Its slot is free now, for the next arrival planned there.
            slots = self.slots.get(job.server_id, 0)
            self.room[job.server_id] = min(self.room[job.server_id] + 1, slots)
        self.server_answered(job.server_id)
        return FreedSlot(job.server_id)

    def server_answered(self, server_id: int) -> None:
        """Mark the server healthy and seen, at most once a second while it keeps answering:
        a busy server's row is not rewritten (and locked) on every completion. After a
        failure the next answer marks it at once. (Written after the completion's commit:
        dispatch locks a server before its deployments, and so must everyone. And after the
        pass that the answer calls for: the next request's dispatch does not wait behind it
        in the database thread.)"""
        if time.monotonic() - self.marked_up.get(server_id, -float("inf")) < 1.0:
            return
        self.marked_up[server_id] = time.monotonic()
        self.to_mark_up.add(server_id)

    def write_marks(self) -> None:
        for server_id in self.to_mark_up:
            self.chore(db(store.server_succeeded)(server_id))
        self.to_mark_up.clear()

    def forget_answers(self, server_id: int) -> None:
        """After a failure: the next answer marks the server up at once, and one not yet
        written must not undo the failure."""
        self.marked_up.pop(server_id, None)
        self.to_mark_up.discard(server_id)

    def chore(self, write: Coroutine) -> None:
        """A database write no task waits for (it is awaited when the worker stops)."""
        future = asyncio.ensure_future(write)
        self.chores.add(future)
        future.add_done_callback(self.chore_done)

    def chore_done(self, future: asyncio.Future) -> None:
        self.chores.discard(future)
        if future.cancelled() or (error := future.exception()) is None:
            return
        if faults.is_database_fault(error):  # the worker starts again (`restarts`)
            log.info("a write no task waits for met a database fault: %r", error)
        else:
            log.error("a write no task waits for failed", exc_info=error)

    async def serve_failed(self, job: store.ServeJob, error: AdapterError, may_retry: bool) -> None:
        self.forget_answers(job.server_id)
        self.next_sends.pop(job.server_id, None)  # the next pass knows how the server is
        state = await db(store.request_failed)(job, error, may_retry)
        log.warning(
            "request %s on %s: %s (%s) → %s",
            job.request_id,
            job.server_name,
            error.code,
            error.message,
            state,
        )
        self.sync_soon(job.server_id)

    async def probe(self, server_id: int) -> None:
        adapter = await self.adapter(server_id)
        try:
            await adapter.health()
        except AdapterError as error:
            await db(store.probe_result)(server_id, error)
        else:
            await db(store.probe_result)(server_id, None)

    async def recheck(self, deployment_id: int, held_by: int | None = None) -> None:
        """Set a load or unload under way to what its server says now (unloaded if it cannot
        say); `held_by` None for orphans."""
        server_id = await db(_server_of)(deployment_id)
        try:
            listed = await (await self.adapter(server_id)).list_models()
        except AdapterError:
            listed = None
        await db(store.recheck_deployment)(deployment_id, listed, held_by)

    # -- status sync ---------------------------------------------------------------------

    async def sync_status_if_due(self) -> None:
        if time.monotonic() - self.last_sync < self.knobs["STATUS_SYNC_S"]:
            return
        self.last_sync = time.monotonic()
        for server in await db(store.all_servers)():
            self.retire_stale_adapter(server)  # a server in cooldown too: its probe needs it
            if server.enabled and server.health != Health.COOLDOWN:
                self.sync_soon(server.pk)

    def sync_soon(self, server_id: int) -> None:
        """Ask the server what it holds, in a task of its own (after a failure, the failed
        task ends at once and the loop plans without waiting for the answer)."""
        if f"sync {server_id}" not in self.tasks:
            self.spawn(f"sync {server_id}", self.sync_server(server_id))

    async def sync_server(self, server_id: int) -> None:
        """Ask the server what it has loaded and correct our deployment states."""
        adapter = await self.adapter(server_id)
        asked_at = timezone.now()
        try:
            listed = await adapter.list_models()
        except AdapterError as error:
            if error.server_fault:
                self.forget_answers(server_id)
                await db(store.mark_down)(server_id, error.message)
            return
        await db(store.apply_server_models)(server_id, listed, asked_at)


class Batch:
    """Consecutive request transitions, then the dispatches that follow them: written in one
    transaction (a pass that routes and sends thirty requests commits once), in the order
    planned. After `write`, each decision's result; its sends are being served already
    (`Runtime.committed`)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.transitions: list[tuple[Decision, Transition]] = []
        self.sends: list[Dispatch] = []
        self.results: list[tuple[Decision, bool]] = []

    @property
    def size(self) -> int:
        return len(self.transitions) + len(self.sends)

    def add(self, decision: Decision) -> bool:
        """Take `decision` if it belongs in this batch (False: write this one first, or
        the decision is more than a request's move)."""
        transition = self.runtime.transition_for(decision)
        if transition is not None and not self.sends:
            self.transitions.append((decision, transition))
            return True
        if isinstance(decision, Dispatch):
            self.sends.append(decision)
            return True
        return False

    def write(self, send_now: store.Sending) -> "Batch":
        """In the database thread."""
        pairs = [(d.request_id, d.deployment_id) for d in self.sends]
        moved, jobs = store.move_and_dispatch(
            [t for _, t in self.transitions], pairs, self.runtime.worker_id, send_now
        )
        self.results = [(d, ok) for (d, _), ok in zip(self.transitions, moved, strict=True)]
        self.results += [(d, job is not None) for d, job in zip(self.sends, jobs, strict=True)]
        return self


def _server_of(deployment_id: int) -> int:
    from backends.models import Deployment

    return Deployment.objects.values_list("server_id", flat=True).get(pk=deployment_id)

"""The worker's loop: read a snapshot, ask the policy, carry out its decisions, wait for news.

The loop decides; `Execution` writes its decisions and `Effects` carries out what reaches
past the database (tasks, adapters, the clock, publishing). Loads, unloads, requests and
probes run as named tasks that report back through the database and wake the loop; the
loop never waits for them. Who owns which state: see `scheduler/runtime/__init__.py`.
"""

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from config import event_loop

from .. import faults, retention, store
from ..decisions import Decision, Defer, Dispatch, Expire, Fail, Probe, SendNext, SendOnArrival
from ..group_commit import GroupCommit
from ..intents import Intents
from ..policy import plan_explained
from ..pool_threads import in_pool_thread
from ..reasons import QUOTA, Reason
from ..snapshot import Snapshot
from ..wakeup import Cancelled, News
from ..webhooks import Webhooks
from .effects import Effects
from .execution import Execution, Home, MovesAndSends, db, homes
from .failing_passes import FailingPasses
from .fast_paths import FastPaths, PassArrivals, SentOnArrival
from .keys_served import KeysServed
from .server_tasks import FreedSlot, ServerTasks

log = logging.getLogger(__name__)

# What a pass's trip to the database thread brings back: the snapshot, the plan's
# decisions, its leading moves and sends (written), and why each request waits.
Planned = tuple[Snapshot, list[Decision], MovesAndSends, Mapping[Any, Reason]]

PURGE_EVERY_S = 300.0  # between looks for finished requests to delete, when none were due
MAX_REPLANS = 3  # passes in a row planned again at once because the database refused some


class Runtime:
    def __init__(
        self,
        effects: Effects | None = None,
        clock: Callable[[], datetime] = timezone.now,
        fast_paths: bool | None = None,
    ) -> None:
        self.effects = effects or Effects(clock)
        self.worker_id: int | None = None
        self.knobs = settings.SWITCHYARD
        # Read and written in the database thread only (inside `plan_and_write`; the
        # arrivals also as answers are written, `Execution.write_completions`).
        self.config = store.policy_config()
        self.snapshots = store.SnapshotReader()
        self.pass_arrivals = PassArrivals()
        self.keys_served = KeysServed()
        # The rest: the event loop's thread only.
        self.reasons = store.ReasonWriter()  # why each request waits, stored as it changes
        self.execution = Execution(self)
        self.server_tasks = ServerTasks(self)
        self.fast = FastPaths(self, fast_paths)
        self.completions = GroupCommit(self.execution.write_completions, self.effects.chores)
        self.intents = Intents(self)  # operators' wishes, carried out after each pass
        self.idle = False  # the loop waits for news: no pass is under way or due
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_context: contextvars.Context | None = None
        self.wake = asyncio.Event()
        self.next_wake: datetime | None = None
        self.next_purge = -float("inf")
        self.waiting = 0  # requests still waiting after the last pass (of those it saw)
        self.waiting_for: set[int] = set()  # servers with a deployment of a waiting model
        self.quota_held = False  # a key's or team's quota holds a waiting request back
        self.server_of: dict[int, Home] = {}  # deployment → server, as of the last snapshot
        self.dropped = 0  # decisions of the last pass that the database refused
        self.crashed: BaseException | None = None
        self.failing = FailingPasses()  # passes that raised, in a row
        self.until_idle = False
        # For tests and embedders: `passes` counts finished passes, `quiet_ends` the tasks
        # whose end called for none; `passed` is notified after each of either, so a caller
        # can await a fact instead of sleeping.
        self.passes = 0
        self.quiet_ends = 0
        self.heartbeats = 0  # leases renewed (tests wait on this one instead of time)
        self.passed = asyncio.Condition()

    def clock(self) -> datetime:
        return self.effects.now()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_context = contextvars.copy_context()
        await self.effects.open(self.news)
        self.worker_id = await db(store.register_worker)()
        await self.take_over()
        loop = event_loop.name(self.loop)
        log.info("worker %s started on %s's event loop", self.worker_id, loop)
        if others := await db(store.workers_beside_simulated)(self.worker_id):
            log.warning(
                "simulated servers (%s) live in each worker's memory, and %d other worker(s)"
                " run: what one loads the others do not have, and their status syncs undo it."
                " Run one worker for a demo on simulated servers.",
                ", ".join(others[1]),
                others[0],
            )

    async def take_over(self) -> bool:
        """Take back work from stale workers and re-check loads that nobody holds. True if
        anything was taken."""
        stale_s = self.knobs["WORKER_STALE_S"]
        moved, recheck = await db(store.take_over_stale_workers)(stale_s, self.worker_id)
        for deployment_id in recheck:
            await self.server_tasks.recheck(deployment_id)
        return bool(moved or recheck)

    async def stop(self) -> None:
        """Stop cleanly: let requests already at their servers finish (up to DRAIN_S), cancel
        the other tasks, then hand back what this worker held so that any worker (this one,
        restarted, or another) runs it again."""
        self.effects.stop_hearing(self.news)
        self.stopping = True  # a slot freed now stays free: this worker sends no more
        await self.drain()
        self.server_tasks.write_marks()  # of the answers while draining
        await self.effects.cancel_all()
        if self.worker_id is not None:
            try:
                _, recheck = await db(store.release_worker)(self.worker_id)
            except faults.DATABASE_FAULTS as error:  # handed back once it answers (`restarts`)
                log.info("worker %s could not hand back its work: %r", self.worker_id, error)
                recheck = []
            for deployment_id in recheck:
                await self.server_tasks.recheck(deployment_id)
        await self.effects.close_adapters()
        await db(close_old_connections)()  # the DB thread outlives the worker
        await self.effects.close()
        log.info("worker %s stopped", self.worker_id)

    async def drain(self) -> None:
        serving = self.effects.serving()
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
        for listener in self.effects.listeners(self.news):
            side.append(asyncio.create_task(listener, name="listen"))
        for task in side:
            task.add_done_callback(self.side_task_done)
        replans = 0
        try:
            while not stop.is_set():
                self.wake.clear()
                await self.server_tasks.sync_status_if_due(self.knobs["STATUS_SYNC_S"])
                try:
                    did = await self.step()
                except Exception as error:
                    if faults.is_database_fault(error):
                        raise
                    await self.pass_failed(error, stop)
                    continue
                if self.failing.worked(self.clock()):
                    await db(store.passes_failing)(self.worker_id, None)
                self.server_tasks.write_marks()
                await self.count_pass()
                if self.crashed:
                    raise self.crashed  # as it came: a lost database ends `run_scheduler` cleanly
                if until_idle and not did and not self.effects.tasks and not self.waiting:
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

    async def pass_failed(self, error: Exception, stop: asyncio.Event) -> None:
        """Say so, and wait to try again (`failing_passes`); what runs goes on meanwhile. A
        task's crash still stops the worker."""
        retry_s = self.failing.failed(error, self.clock())
        await db(store.passes_failing)(self.worker_id, self.failing.since, self.failing.error)
        async with self.passed:
            self.passed.notify_all()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(retry_s):
                while not (stop.is_set() or self.crashed):
                    self.wake.clear()
                    await self.wake.wait()
        if self.crashed:
            raise self.crashed

    async def count_pass(self) -> None:
        async with self.passed:
            self.passes += 1
            self.passed.notify_all()

    async def count_quiet_end(self) -> None:
        async with self.passed:
            self.quiet_ends += 1
            self.passed.notify_all()

    def news(self, arrived: News) -> None:
        """Something to plan for (`arrived`: a new request), unless a fast path took care of
        it (a new request sent on arrival). A request cancelled while this worker serves it
        (`Cancelled`): its call is stopped, and the pass its end calls for fills the slot."""
        if isinstance(arrived, Cancelled):
            rid = arrived.request_id
            if self.effects.cancel(f"serve {rid}") is not None:
                log.info("request %s was cancelled; its call to its server is stopped", rid)
            return
        self.intents.news(arrived)
        if arrived is not None and self.fast.arrived(arrived):
            return
        self.wake.set()

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
        next_sync = self.server_tasks.next_sync_in(self.knobs["STATUS_SYNC_S"])
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
        """Delete a chunk of requests finished past their keeping time: at each heartbeat
        while a backlog lasts, else every PURGE_EVERY_S (outside the pass's thread)."""
        if self.effects.monotonic() < self.next_purge:
            return
        purged = await in_pool_thread(retention.purge_due)(chunks=1)
        pause = 0.0 if purged == retention.PURGE_CHUNK else PURGE_EVERY_S
        self.next_purge = self.effects.monotonic() + pause

    # -- one pass ------------------------------------------------------------------------

    async def step(self) -> list[Decision]:
        """One snapshot, plan and execute pass. Returns what it did (Defer excluded)."""
        arrivals_seen = len(self.fast.arrivals)  # those after may be missing from the snapshot
        worker_id = self.worker_id

        def plan_and_write(send_now: store.Sending) -> Planned:
            return self.plan_and_write(send_now, worker_id, arrivals_seen)

        snapshot, decisions, first, reasons = await self.execution.committed(plan_and_write)
        self.server_tasks.sync_new(snapshot.servers)
        self.server_of = homes(snapshot)
        self.next_wake = None
        done: list[Decision] = []
        self.dropped = 0
        for decision, ok in await self.execution.carry_out(decisions, first):
            if ok:
                done.append(decision)
                said_of_end(decision)
            elif not isinstance(decision, Defer | Probe):  # a probe still out is no news
                self.dropped += 1
        # Why the requests left waiting wait: stored where it changed, after the moves.
        if changed := self.reasons.changed(reasons):
            await db(store.write_reasons)(changed)
        # Those it sent or ended wait no more: their completion alone calls for no pass.
        ended = {d.request_id for d in done if isinstance(d, Dispatch | Expire | Fail)}
        models = {r.model for r in snapshot.requests if r.id not in ended}
        self.waiting = len(snapshot.requests) - len(ended)
        self.waiting_for = {d.server_id for d in snapshot.deployments if d.model in models}
        self.quota_held = any(r.kind == QUOTA for r in reasons.values())
        await self.intents.after_pass(snapshot)
        return done

    def plan_and_write(
        self, send_now: store.Sending, worker_id: int | None, arrivals_seen: int
    ) -> "Planned":
        """In the database thread: read the snapshot, plan, and write the plan's leading
        request moves and sends (most passes are only those): one trip to the thread, not
        two. The plan's `SendNext` replace the last pass's at once (on the loop): a slot
        may free before this pass's writes are done. Touches no state of the loop's: the
        plan's reasons why requests wait go back with the rest."""
        snapshot = self.snapshots.read(self.config)
        number = self.pass_arrivals.read(snapshot)
        snapshot = self.keys_served.read(snapshot, number)
        server_of = homes(snapshot)
        slots = {s.id: s.slots for s in snapshot.servers}
        planned = plan_explained(snapshot, self.clock())  # the clock: read from any thread
        # Read here, not changed: the loop replaces what it holds after this pass is written.
        decisions = self.reasons.with_last_reasons(planned.decisions)
        later = [d for d in decisions if isinstance(d, SendNext | SendOnArrival)]
        decisions = [d for d in decisions if not isinstance(d, SendNext | SendOnArrival)]
        self.call_on_loop(self.fast.install, later, arrivals_seen, slots, number)
        moves = MovesAndSends(worker_id, server_of)
        for decision in decisions:
            if not moves.add(decision):
                break
        written = moves.write(send_now) if moves.size else moves
        return snapshot, decisions, written, planned.reasons

    def call_on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """From the database thread, in the loop's context, not this thread's: the tasks it
        starts belong to the loop, whatever context the thread runs in."""
        assert self.loop is not None and self.loop_context is not None
        self.loop.call_soon_threadsafe(callback, *args, context=self.loop_context)

    # -- tasks ---------------------------------------------------------------------------

    def spawn(self, name: str, work: Coroutine) -> asyncio.Task:
        """Start a task (through `Effects`); its end may call for a pass."""
        return self.effects.start(name, work, self.task_ended)

    def task_ended(self, name: str, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception():
            # Its rows (a request processing, a load under way) would stay held by a
            # worker that is alive: the worker stops instead, and hands them back.
            crash = task.exception()
            if not faults.is_database_fault(crash):
                log.error("task %s crashed; the worker stops", name, exc_info=crash)
            elif self.crashed is None:  # the database's fault: said once, by `restarts`
                log.info("task %s met a database fault; the worker stops", name)
            self.crashed = self.crashed or crash
        elif not task.cancelled() and not self.calls_for_pass(task.result()):
            self.server_tasks.write_marks()  # no pass comes to write them after
            self.effects.chore(self.count_quiet_end())
            return
        self.wake.set()

    def calls_for_pass(self, ended: object) -> bool:
        """Whether a task's end (what it returned) calls for a pass."""
        if isinstance(ended, SentOnArrival):
            return self.until_idle
        return not isinstance(ended, FreedSlot) or self.plan_after_news(ended)

    def plan_after_news(self, freed: FreedSlot) -> bool:
        """Whether a request that completed calls for a pass: only if a request was waiting
        at the last one for a model deployed on its server (only those can take the freed
        slot, or have that server load their model once it is idle; a deep line for models
        elsewhere is not replanned on every completion), or if a key's or team's quota held
        one back (a completion on any server may free it), or to notice idleness. A new
        arrival wakes the loop by itself."""
        return freed.server_id in self.waiting_for or self.quota_held or self.until_idle

    async def execute(self, decision: Decision) -> bool:
        """Carry out one decision (an operator's intent's, say): see `Execution.execute`."""
        return await self.execution.execute(decision)


def said_of_end(decision: Decision) -> None:
    """A request the policy ended without an answer is the operator's business: why it
    expired or failed (its error says the same to its caller)."""
    match decision:
        case Expire(request_id=rid, reason=reason):
            log.warning("request %s expired: %s", rid, reason)
        case Fail(request_id=rid, code=code, message=message):
            log.warning("request %s failed (%s): %s", rid, code, message)

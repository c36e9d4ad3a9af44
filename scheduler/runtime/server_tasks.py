"""What the worker's tasks do at the servers: loads, unloads, requests, probes, status
syncs. Each runs as a named task (started through `Effects`), calls its server through an
adapter and reports back through the database; the loop never waits for them.

State (the health marks): touched on the event loop's thread only.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from django.utils import timezone

from backends import discovery
from backends.adapters.base import Adapter, AdapterError, ErrorCode
from backends.adapters.http import wants_usage
from backends.models import Health

from .. import store, streams
from ..snapshot import ServerView
from . import execution
from .execution import db

if TYPE_CHECKING:
    from .loop import Runtime

log = logging.getLogger(__name__)

# Asking a server what it says of a model it runs (its facts after a load, what it runs
# now): one that cannot say in time cannot say.
ASK_TIMEOUT_S = 5.0
T = TypeVar("T")
OUTSIDE_POLL_S = 0.5  # asking again whether requests Switchyard did not send have finished


async def in_time(asked: Awaitable[T | None]) -> T | None:
    """What a server says it runs, or None (it cannot say) if it does not answer within
    ASK_TIMEOUT_S: an eviction, an idle TTL or a status sync waits for it no longer."""
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            return await asked
    except TimeoutError:
        return None


class LoadCalledOff(Exception):
    """Nobody waits for a load any more while it waits for requests that Switchyard did not
    send to finish on a victim: the victim stays loaded for them."""


class FreedSlot(NamedTuple):
    """What a request's completion returns: the plan changes only if a request waits that
    this server's freed slot could serve."""

    server_id: int


class ServerTasks:
    def __init__(self, runtime: "Runtime") -> None:
        self.rt = runtime
        self.effects = runtime.effects
        self.last_sync = -float("inf")
        self.asked: set[int] = set()  # servers a status sync has asked (or is asking)
        self.marked_up: dict[int, float] = {}  # server → when an answer last marked it up
        self.to_mark_up: set[int] = set()  # servers whose answer's mark waits for the pass
        self.refused: dict[int, str] = {}  # server → why it refused its last status sync
        self.room_asked: set[int] = set()  # servers whose own room this worker asked
        # deployment → (its load, its server's last task id there), as the last sync saw it
        self.tasks_seen: dict[int, tuple[datetime | None, int]] = {}

    # -- loads and unloads ---------------------------------------------------------------

    async def load(self, job: store.LoadJob) -> None:
        adapter = await self.effects.adapter(job.server_id)
        started = time.monotonic()
        last_report = 0.0
        waited = 0.0  # for requests Switchyard did not send: no part of the load's time

        def progress(fraction: float) -> None:
            nonlocal last_report
            if time.monotonic() - last_report >= 0.5 or fraction >= 1.0:
                last_report = time.monotonic()
                self.effects.chore(db(store.set_load_progress)(job.deployment_id, fraction))

        try:
            waited = await self.evict(adapter, job)
            async with asyncio.timeout(job.target.timeout_s):
                await adapter.load(job.target, progress)
        except TimeoutError:
            message = f"load timed out after {job.target.timeout_s:.0f} s"
            await self.load_failed(job, AdapterError(ErrorCode.LOAD_FAILED, message))
            await self.unload_quietly(adapter, job.target.server_model_id)
        except LoadCalledOff:
            await db(store.load_called_off)(job)
            log.info(
                "called off the load of %s on %s: nobody waits for it any more, and what"
                " it would evict stays loaded for the requests Switchyard did not send",
                job.model_name,
                job.server_name,
            )
        except AdapterError as error:
            await self.load_failed(job, error)
        except Exception as exc:  # an adapter bug must not leave the deployment `loading`
            log.exception("loading %s crashed", job.model_name)
            await self.load_failed(job, AdapterError(ErrorCode.LOAD_FAILED, repr(exc)))
        else:
            if job.learn_facts:
                target = job.target.server_model_id
                await self.learn_facts(adapter, job.deployment_id, target, job.server_name)
            await db(store.load_succeeded)(job, time.monotonic() - started - waited)
            self.server_answered(job.server_id)

    async def learn_facts(
        self,
        adapter: Adapter,
        deployment_id: int,
        model: str,
        server_name: str,
        when: str = "after the load",
    ) -> None:
        """Before the model's first requests are sent: what its server says of it now that
        it runs (llama-server's slots, its chat template's capabilities, its context), where
        nobody has said it, so that it is sent no more at once than it serves (llama-server
        queues the rest out of our sight). After a load, or once the status sync finds it
        loaded outside Switchyard. A server that cannot say is not asked again until then."""
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                found = await discovery.described(adapter, only=model)
        except (AdapterError, TimeoutError) as error:
            why = getattr(error, "message", f"no answer in {ASK_TIMEOUT_S:.0f} s")
            log.info("%s on %s: could not learn its slots: %s", model, server_name, why)
            return
        if found and (filled := await db(discovery.fill_empty_facts)(deployment_id, found[0])):
            log.info("learnt from %s %s: %s", server_name, when, "; ".join(filled))

    async def evict(self, adapter: Adapter, job: store.LoadJob) -> float:
        """Unload the victims first, each once what others run on it has finished; the
        seconds that took. One that fails to unload is re-checked with the server, so it
        never stays `unloading`, and the load counts as failed."""
        waited = 0.0
        for victim_id, server_model_id in job.evict:
            waited += await self.outside_finish(adapter, job, server_model_id)
            try:
                await adapter.unload(server_model_id)
            except AdapterError:
                for left_id, _ in job.evict:
                    await self.recheck(left_id, held_by=job.worker_id)
                raise
            await db(store.evicted)(victim_id, to_make_room=True)
        return waited

    async def outside_finish(self, adapter: Adapter, job: store.LoadJob, victim: str) -> float:
        """Let the requests the server runs on a victim that Switchyard did not send finish
        before it is unloaded (that cuts them off), for up to `OUTSIDE_GRACE_S`; the seconds
        that took. Should nobody wait for the load any more meanwhile, it is called off
        (`LoadCalledOff`)."""
        if not (running := await in_time(adapter.running(victim))):
            return 0.0
        grace_s = self.rt.knobs["OUTSIDE_GRACE_S"]
        started = time.monotonic()
        if grace_s > 0:
            log.info(
                "%s first lets %d request(s) on %s that Switchyard did not send finish, for"
                " up to %g s, before unloading it for %s",
                job.server_name,
                running,
                victim,
                grace_s,
                job.model_name,
            )
        while running and time.monotonic() - started < grace_s:
            await asyncio.sleep(OUTSIDE_POLL_S)
            if not await db(store.load_wanted)(job.deployment_id):
                raise LoadCalledOff  # unloading the victim would now cut them off for nothing
            running = await in_time(adapter.running(victim))
        waited = time.monotonic() - started
        if running:
            log.warning(
                "unloading %s from %s for %s cuts off %d request(s) Switchyard did not send"
                " (SWITCHYARD_OUTSIDE_GRACE_S is %g s)",
                victim,
                job.server_name,
                job.model_name,
                running,
                grace_s,
            )
        else:
            log.info(
                "%s: the request(s) on %s that Switchyard did not send finished in %.0f s",
                job.server_name,
                victim,
                waited,
            )
        return waited

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

    async def unload(
        self, deployment_id: int, server_id: int, model_id: str, why: str, if_unused: bool = False
    ) -> None:
        adapter = await self.effects.adapter(server_id)
        if if_unused and (running := await in_time(adapter.running(model_id))):
            # Someone else's requests (it runs none of ours): unloading would cut them off.
            await db(store.unload_called_off)(deployment_id)
            log.info(
                "kept %s loaded (%s): its server runs %d request(s) on it that Switchyard did"
                " not send; idle from now",
                model_id,
                why,
                running,
            )
            return
        try:
            await adapter.unload(model_id)
        except AdapterError as error:
            log.warning("unloading %s failed: %s", model_id, error.message)
            await self.recheck(deployment_id, held_by=self.rt.worker_id)
            return
        log.info("unloaded %s (%s)", model_id, why)
        await db(store.evicted)(deployment_id)

    async def stop_load(self, job: store.StopJob, why: str) -> None:
        """Stop a load that nobody waits for any more (`StopLoad`): cancel its task, then
        have the server drop what it was loading. A load that finished meanwhile is simply
        unloaded; a server that cannot say it stopped is asked what it holds."""
        load = self.effects.cancel(execution.load_task(job.model_name, job.server_name))
        if load is not None:
            await asyncio.gather(load, return_exceptions=True)
        adapter = await self.effects.adapter(job.server_id)
        try:
            await adapter.unload(job.server_model_id)
        except AdapterError as error:
            log.warning(
                "stopping the load of %s on %s failed: %s",
                job.model_name,
                job.server_name,
                error.message,
            )
            await self.recheck(job.deployment_id, held_by=self.rt.worker_id)
            return
        log.info("stopped the load of %s on %s: %s", job.model_name, job.server_name, why)
        await db(store.evicted)(job.deployment_id)

    async def recheck(self, deployment_id: int, held_by: int | None = None) -> None:
        """Set a load or unload under way to what its server says now (unloaded if it cannot
        say); `held_by` None for orphans."""
        server_id = await db(store.server_of_deployment)(deployment_id)
        if server_id is None:  # deleted meanwhile
            return
        try:
            listed = await (await self.effects.adapter(server_id)).list_models()
        except AdapterError:
            listed = None
        await db(store.recheck_deployment)(deployment_id, listed, held_by)

    # -- requests ------------------------------------------------------------------------

    async def serve(self, job: store.ServeJob, committed: asyncio.Event) -> FreedSlot | None:
        adapter = await self.effects.adapter(job.server_id)
        # A call cannot be taken back: it waits for its dispatch's commit. Should that fail,
        # or its outcome be unknown, the request is sent again, and must not have run.
        await committed.wait()
        started = time.monotonic()
        relay = streams.Relay(job.request_id, committed, usage_asked=wants_usage(job.call))
        try:
            if job.call.stream:
                result = await relay.run(adapter.stream(job.call))
            else:
                result = await adapter.run(job.call)
        except AdapterError as error:
            await self.serve_failed(job, error, may_retry=not relay.sent)
            return None
        except Exception as exc:  # an adapter bug must not leave the request `processing`
            log.exception("request %s crashed in its adapter", job.request_id)
            error = AdapterError(ErrorCode.SERVER_ERROR, repr(exc))
            await self.serve_failed(job, error, may_retry=False)
            return None
        seconds = time.monotonic() - started
        fast = self.rt.fast
        then_send = fast.next_send(job.server_id)
        answer = store.Answer(job, result, seconds, then_send)
        if not await self.rt.completions.submit(answer):
            log.warning(
                "request %s finished after it was taken over or cancelled; result dropped",
                job.request_id,
            )
        elif then_send is None:
            fast.slot_freed(job.server_id)
        self.server_answered(job.server_id)
        return FreedSlot(job.server_id)

    async def serve_failed(self, job: store.ServeJob, error: AdapterError, may_retry: bool) -> None:
        self.forget_answers(job.server_id)
        self.rt.fast.server_failed(job.server_id)
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

    # -- server health -------------------------------------------------------------------

    async def probe(self, server_id: int) -> None:
        try:
            await (await self.effects.adapter(server_id)).health()
        except AdapterError as error:
            await db(store.probe_result)(server_id, error)
        else:
            await db(store.probe_result)(server_id, None)

    def server_answered(self, server_id: int) -> None:
        """Mark the server healthy and seen, at most once a second while it keeps answering:
        a busy server's row is not rewritten (and locked) on every completion. After a
        failure the next answer marks it at once. (Written after the completion's commit:
        dispatch locks a server before its deployments, and so must everyone. And after the
        pass that the answer calls for: the next request's dispatch does not wait behind it
        in the database thread.)"""
        now = self.effects.monotonic()
        if now - self.marked_up.get(server_id, -float("inf")) < 1.0:
            return
        self.marked_up[server_id] = now
        self.to_mark_up.add(server_id)

    def write_marks(self) -> None:
        for server_id in self.to_mark_up:
            self.effects.chore(db(store.server_succeeded)(server_id))
        self.to_mark_up.clear()

    def forget_answers(self, server_id: int) -> None:
        """After a failure: the next answer marks the server up at once (and asks its room
        again: a restart may change it), and one not yet written must not undo the
        failure."""
        self.marked_up.pop(server_id, None)
        self.room_asked.discard(server_id)
        self.to_mark_up.discard(server_id)

    # -- status sync ---------------------------------------------------------------------

    def next_sync_in(self, every_s: float) -> float:
        return self.last_sync + every_s - self.effects.monotonic()

    async def sync_status_if_due(self, every_s: float) -> None:
        if self.effects.monotonic() - self.last_sync < every_s:
            return
        self.last_sync = self.effects.monotonic()
        for server in await db(store.all_servers)():
            self.effects.retire_stale_adapter(server)  # one in cooldown too: its probe needs it
            self.asked.add(server.pk)
            if server.enabled and server.health != Health.COOLDOWN:
                self.sync_soon(server.pk)

    def sync_new(self, servers: Iterable[ServerView]) -> None:
        """A server an operator added since the last round is asked at once, not at the next
        round (its card said `unknown` until then, and nothing was sent to it)."""
        if self.last_sync == -float("inf"):
            return  # no round yet: the first asks every server
        for server in servers:
            if server.id not in self.asked:
                self.asked.add(server.id)
                if server.enabled and server.health != Health.COOLDOWN:
                    self.sync_soon(server.id)

    def sync_soon(self, server_id: int) -> None:
        """Ask the server what it holds, in a task of its own (after a failure, the failed
        task ends at once and the loop plans without waiting for the answer)."""
        if not self.effects.running(f"sync {server_id}"):
            self.rt.spawn(f"sync {server_id}", self.sync_server(server_id))

    async def sync_server(self, server_id: int) -> None:
        """Ask the server what it has loaded and correct our deployment states."""
        asked_at = timezone.now()
        try:
            adapter = await self.effects.adapter(server_id)
            listed = await adapter.list_models()
        except AdapterError as error:
            if error.server_fault:
                self.forget_answers(server_id)
                await db(store.mark_down)(server_id, error.message)
            else:
                await self.sync_refused(server_id, error)
            return
        self.refused.pop(server_id, None)
        if server_id not in self.room_asked:
            self.room_asked.add(server_id)
            await self.check_room(adapter, server_id)
        synced = await db(store.apply_server_models)(server_id, listed, asked_at)
        if adapter.tells_activity:
            await self.see_activity(adapter, synced.loaded, asked_at)
        if synced.to_learn:
            name = await db(store.server_name)(server_id)
            for deployment_id, model in synced.to_learn:
                outside = "of a model loaded outside Switchyard"
                await self.learn_facts(adapter, deployment_id, model, name, outside)

    async def see_activity(
        self,
        adapter: Adapter,
        loaded: list[tuple[int, str, datetime | None]],
        asked_at: datetime,
    ) -> None:
        """A loaded model with an idle TTL that the server ran requests on since the last
        sync counts as used then, whoever sent them: clients that call the server directly
        use it too, though Switchyard sends it nothing (its idle TTL, its place among the
        victims). A task id is compared only within one load (a new one counts from 0)."""
        used = []
        for deployment_id, model, loaded_at in loaded:
            seen = await in_time(adapter.activity(model))
            if seen is None:
                continue
            before = self.tasks_seen.get(deployment_id)
            self.tasks_seen[deployment_id] = (loaded_at, seen.tasks)
            moved = before is not None and before[0] == loaded_at and before[1] != seen.tasks
            if seen.running or moved:
                used.append(deployment_id)
        if used:
            await db(store.seen_used)(used, asked_at)

    async def check_room(self, adapter: Adapter, server_id: int) -> None:
        """As a worker reaches a server (first, and after each failure: a restart may
        change it), learn how many models it runs at once: a router at its `--models-max`
        would stop models behind our back and refuse loads while all are busy, so the
        policy keeps no more there (`max_models`)."""
        try:
            room = await adapter.room()
        except AdapterError:
            self.room_asked.discard(server_id)  # asked again at the next sync
            return
        if room is not None and (learnt := await db(store.learn_room)(server_id, room)):
            log.info("%s", learnt)

    async def sync_refused(self, server_id: int, error: AdapterError) -> None:
        """A server that answers, but not with its model list: another kind of server, or
        something else at its address (a web page's 404), or a key it does not take (401).
        Nothing is marked (its loads will fail, or succeed where only the list is missing),
        but the log says so once, not at every sync."""
        if self.refused.get(server_id) == error.message:
            return
        self.refused[server_id] = error.message
        name = await db(store.server_name)(server_id)
        log.warning(
            "server %s answers, but not with its model list (%s: %s): is it a server of its"
            " kind at that address? `manage.py check_servers %s` says what answers there",
            name,
            error.code,
            error.message,
            name,
        )

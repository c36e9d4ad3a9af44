"""Where each decision kind is carried out: the one place for each.

- `Route`, `Requeue`, `MarkReady`, `Expire`, `Fail`: `transition_for`, written by a `MovesAndSends`
  (one transaction with the pass's sends that follow).
- `Dispatch`: a `MovesAndSends` (`store.move_and_dispatch`); its calls start in `committed`.
- `StartLoad`, `Unload`, `StopLoad`, `Probe`: `execute` (a store write, then a task of
  `ServerTasks`).
- `Defer`: `execute` (the loop's next wake-up).
- `SendNext`, `SendOnArrival`: installed in `FastPaths` (fast_paths.py); sent by a
  completion (`write_completions`) or an arrival (`send_on_arrival`), through `committed`.

Operators' intents (`Intents.after_pass`) hand their decisions to `execute` too.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from django.utils import timezone

from .. import conflicts, decisions, store
from ..database_thread import in_database_thread
from ..decisions import Decision, Dispatch, Route
from ..models import WAITING_STATES, State
from ..snapshot import Snapshot
from ..transitions import Transition

if TYPE_CHECKING:
    from .loop import Runtime

log = logging.getLogger(__name__)
T = TypeVar("T")


def db(fn: Callable[..., T]) -> Callable[..., Any]:
    """`fn` in the database thread, run again should it lose a lock conflict."""
    return in_database_thread(conflicts.retried(fn))


def load_task(model_name: str, server_name: str) -> str:
    """The name of the task that loads `model_name` on `server_name` (one at most)."""
    return f"load {model_name}@{server_name}"


class Home(NamedTuple):
    """A deployment's server, as of a pass's snapshot."""

    server_id: int
    server: str  # its name, for the trace


def homes(snapshot: Snapshot) -> dict[int, Home]:
    """Each deployment's server."""
    names = {s.id: s.name for s in snapshot.servers}
    return {d.id: Home(d.server_id, names.get(d.server_id, "")) for d in snapshot.deployments}


def server_name(server_of: dict[int, Home], deployment_id: int | None) -> str:
    """Where a deployment is, for a trace row ("" for one gone since the snapshot)."""
    home = server_of.get(deployment_id) if deployment_id is not None else None
    return home.server if home else ""


def transition_for(decision: Decision, server_of: dict[int, Home]) -> Transition | None:
    """The request transition that carries out `decision`, if that is all it takes
    (`server_of`: each deployment's server, as of the pass's snapshot)."""
    match decision:
        case decisions.Expire(request_id=rid, reason=reason):
            fields = {"error": f"expired: {reason}", "error_code": "expired"}
            return Transition(rid, WAITING_STATES, State.EXPIRED, reason, fields)
        case decisions.Fail(request_id=rid, code=code, message=message):
            fields = {"error": message, "error_code": code}
            return Transition(rid, WAITING_STATES, State.FAILED, message, fields)
        case Route(request_id=rid, deployment_id=did, ready=ready, reason=reason):
            now = timezone.now()
            home = server_of[did]
            fields = {"deployment_id": did, "routed_at": now, "server_id": home.server_id}
            if ready:
                fields["ready_at"] = now
            to = State.READY if ready else State.NEEDS_LOADING
            return Transition(rid, (State.PENDING,), to, reason, fields, home.server)
        case decisions.Requeue(request_id=rid, reason=reason, deployment_id=did):
            fields = {"deployment": None, "server": None}
            return Transition(
                rid,
                (State.NEEDS_LOADING, State.READY),
                State.PENDING,
                reason,
                fields,
                server_name(server_of, did),
            )
        case decisions.MarkReady(request_id=rid, deployment_id=did):
            fields = {"ready_at": timezone.now()}
            at = server_name(server_of, did)
            return Transition(
                rid, (State.NEEDS_LOADING,), State.READY, "its model is loaded", fields, at
            )
    return None


class MovesAndSends:
    """Consecutive request transitions, then the dispatches that follow them: written in one
    transaction (a pass that routes and sends thirty requests commits once), in the order
    planned. After `write`, each decision's result; its sends are being served already
    (`Execution.committed`). Built on either thread; what it reads is given to it."""

    def __init__(self, worker_id: int | None, server_of: dict[int, Home]) -> None:
        self.worker_id = worker_id
        self.server_of = server_of
        self.transitions: list[tuple[Decision, Transition]] = []
        self.sends: list[Dispatch] = []
        self.results: list[tuple[Decision, bool]] = []

    @property
    def size(self) -> int:
        return len(self.transitions) + len(self.sends)

    def add(self, decision: Decision) -> bool:
        """Take `decision` if it belongs with these (False: write this one first, or
        the decision is more than a request's move)."""
        transition = transition_for(decision, self.server_of)
        if transition is not None and not self.sends:
            self.transitions.append((decision, transition))
            return True
        if isinstance(decision, Dispatch):
            self.sends.append(decision)
            return True
        return False

    def write(self, send_now: store.Sending) -> "MovesAndSends":
        """In the database thread."""
        pairs = [(d.request_id, d.deployment_id) for d in self.sends]
        moved, jobs = store.move_and_dispatch(
            [t for _, t in self.transitions], pairs, self.worker_id, send_now
        )
        self.results = [(d, ok) for (d, _), ok in zip(self.transitions, moved, strict=True)]
        self.results += [(d, job is not None) for d, job in zip(self.sends, jobs, strict=True)]
        return self


class Execution:
    """Carries out the loop's decisions: writes them (in the database thread) and starts
    the tasks that follow (through the loop's `Effects`)."""

    def __init__(self, runtime: "Runtime") -> None:
        self.rt = runtime

    async def carry_out(self, decisions: list[Decision], first: MovesAndSends) -> list[tuple]:
        """The rest of a pass's decisions, after the `first` `MovesAndSends` (written with its
        snapshot): each decision, and whether it was carried out."""
        rt = self.rt
        results = list(first.results)
        moves = MovesAndSends(rt.worker_id, rt.server_of)
        for decision in decisions[first.size :]:
            if moves.add(decision):
                continue
            if moves.size:
                results += (await self.committed(moves.write)).results
                moves = MovesAndSends(rt.worker_id, rt.server_of)
            if not moves.add(decision):
                results.append((decision, await self.execute(decision)))
        if moves.size:
            results += (await self.committed(moves.write)).results
        return results

    async def execute(self, decision: Decision) -> bool:
        """Carry out a decision that is more than a request transition; False when it was
        dropped (the row moved meanwhile)."""
        rt = self.rt
        match decision:
            case decisions.Defer(until=until):
                rt.next_wake = until if rt.next_wake is None else min(rt.next_wake, until)
                return False
            case decisions.StartLoad(deployment_id=did, evict=evict, reason=reason, cause=cause):
                job = await db(store.start_load)(did, evict, rt.worker_id, reason, cause)
                if job is None:
                    return False
                rt.spawn(load_task(job.model_name, job.server_name), rt.server_tasks.load(job))
                return True
            case decisions.StopLoad(deployment_id=did, reason=reason):
                stop = await db(store.stop_load)(did, rt.worker_id)
                if stop is None:
                    return False
                rt.spawn(f"stop {did}", rt.server_tasks.stop_load(stop, reason))
                return True
            case decisions.Unload(deployment_id=did, reason=reason, if_unused=if_unused):
                target = await db(store.start_unload)(did, rt.worker_id)
                if target is None:
                    return False
                unload = rt.server_tasks.unload(did, *target, reason, if_unused)
                rt.spawn(f"unload {did}", unload)
                return True
            case decisions.Probe(server_id=sid):
                name = f"probe {sid}"
                if rt.effects.running(name):  # one probe decides; it is still out
                    return False
                rt.spawn(name, rt.server_tasks.probe(sid))
                return True
        raise TypeError(f"unknown decision {decision!r}")

    async def send_on_arrival(self, routes: list[Route]) -> list[bool]:
        """New requests routed and sent where the last pass planned (`SendOnArrival`)."""
        moves = [transition_for(r, self.rt.server_of) for r in routes]
        sends = [(r.request_id, r.deployment_id) for r in routes]
        worker_id = self.rt.worker_id
        jobs = await self.committed(
            lambda send_now: store.send_on_arrival(moves, sends, worker_id, send_now)
        )
        return [job is not None for job in jobs]

    async def write_completions(self, answers: list[store.Answer]) -> list[bool]:
        """Answers stored, and the requests planned for their freed slots sent (`SendNext`),
        but for those a request seen by a later pass may go before (the next pass fills
        their slots)."""
        notify = self.rt.fast.notify_origin
        arrivals = self.rt.pass_arrivals

        def write(send_now: store.Sending) -> list[bool]:  # in the database thread
            due = [
                replace(a, then_send=None)
                if a.then_send is not None and arrivals.outranked(a.then_send)
                else a
                for a in answers
            ]
            return store.requests_completed(due, send_now, notify_origin=notify)

        return await self.committed(write)

    async def committed(self, write: Callable[[store.Sending], T]) -> T:
        """Run a write in the database thread that may send requests, and serve them.

        With the fast paths on, given a `send_now`, it hands over the jobs as soon as their
        rows' and slots' locks are held, and their serve tasks start at once (an adapter is
        ready by the commit), but each call to its server waits for the commit: a call
        cannot be taken back, and should the commit fail or its outcome be unknown (the
        database went away), the request is sent again. The tasks are then cancelled before
        they call anyone. With the fast paths off, the tasks start once the commit is made."""
        rt = self.rt
        for attempt in range(conflicts.ATTEMPTS):
            commit = asyncio.Event()
            tasks: list[asyncio.Task] = []
            held: list[store.ServeJob] = []

            def start_serving(jobs: list[store.ServeJob], commit=commit, tasks=tasks) -> None:
                for job in jobs:
                    work = rt.server_tasks.serve(job, commit)
                    tasks.append(rt.spawn(f"serve {job.request_id}", work))

            def send_now(jobs: list[store.ServeJob], held=held) -> None:
                if rt.fast.tasks_before_commit:
                    rt.call_on_loop(start_serving, jobs)
                else:
                    held.extend(jobs)

            try:
                result = await in_database_thread(write)(send_now)
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
            start_serving(held)
            return result
        raise AssertionError("unreachable")

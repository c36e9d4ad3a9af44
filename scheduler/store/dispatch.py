"""Sending requests to their deployments: the dispatch, with the moves of a pass."""

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction
from django.utils import timezone

from backends.adapters.base import InferenceCall
from backends.models import Deployment, DeploymentState, merged_load_options

from .. import sql
from ..models import TERMINAL_STATES, Priority, Request, State
from ..transitions import Locked, Transition, locking, move_all
from .queries import DEPLOYMENTS, lock_servers, servers_deployments

DS = DeploymentState


@dataclass(frozen=True)
class ServeJob:
    request_id: Any
    deployment_id: int
    server_id: int
    server_name: str
    worker_id: int
    call: InferenceCall


class LoadedDeployment(NamedTuple):
    """What a dispatch reads of a deployment it may send to."""

    id: int
    model_id: int
    server_id: int
    server_name: str
    server_model_id: str
    load_options: dict


def _loaded(
    slots: dict[int, int], rows: list[tuple]
) -> tuple[dict[int, int], dict[int, LoadedDeployment], dict[int, int]]:
    """Each server's requests in flight, its loaded deployments, and what is left of the
    slots of those that have their own."""
    busy = dict.fromkeys(slots, 0)
    loaded, own_room = {}, {}
    for row in rows:
        did, model_id, server_id, name, server_model_id, *options, state, in_flight, own = row
        busy[server_id] += in_flight
        if own is not None:
            own_room[did] = own - in_flight
        if state == DS.LOADED:
            options = merged_load_options(*map(json.loads, options))
            loaded[did] = LoadedDeployment(did, model_id, server_id, name, server_model_id, options)
    return busy, loaded, own_room


class SentRequest(NamedTuple):
    """What a dispatch reads of a request it may send (its row locked)."""

    model_id: int
    priority: int
    payload: str  # JSON as stored, parsed only for a request that is sent
    kind: str
    stream: bool


Sending = Callable[[list[ServeJob]], None]


def dispatch_all(
    sends: list[tuple[Any, int]],
    worker_id: int,
    routes: dict[Any, Transition] | None = None,
    send_now: Sending | None = None,
    reason: str = "sent to the server",
) -> list[ServeJob | None]:
    """Send ready requests to their deployments, in one transaction: each (request,
    deployment) becomes a ServeJob, or None if its slot, its model or its row is gone (or
    the deployment is of another model: a send on arrival goes by the name in a wake-up).

    `routes`: the moves from pending to ready of requests routed in the same pass; one that
    is sent moves once, pending to processing (its trace still shows both steps).
    `send_now`: given the jobs as soon as they are known, under the rows' locks and before
    the commit (see `Execution.committed`)."""
    routes = routes or {}
    if not sends:
        return []
    jobs: list[ServeJob | None] = []
    deployment_ids = sorted({did for _, did in sends})
    keys = sql.keys(Request, dict.fromkeys(rid for rid, _ in sends))
    with transaction.atomic(savepoint=False):
        # Servers first, then their deployments: workers dispatching at once never overfill
        # a server's slots. One round trip for the three reads.
        server_rows, deployment_rows, request_rows = sql.fetch_all(
            [
                lock_servers(deployment_ids),
                servers_deployments(deployment_ids),
                # Locked too: the moves below are then known, and go with the commit.
                locking("id, model_id, priority, payload, kind, stream, state, worker_id", keys),
            ]
        )
        slots = dict(server_rows)
        busy, deployments, own_room = _loaded(slots, deployment_rows)
        requests: dict[Any, SentRequest] = {}
        locked: Locked = {}
        for key, model_id, priority, payload, kind, stream, state, worker in request_rows:
            requests[sql.uuid_of(key)] = SentRequest(model_id, priority, payload, kind, stream)
            locked[key] = (state, worker)
        accepted: dict[Any, LoadedDeployment] = {}
        for request_id, deployment_id in sends:
            d = deployments.get(deployment_id)
            if d is None or busy[d.server_id] >= slots[d.server_id]:
                continue
            if own_room.get(d.id, 1) <= 0:  # the model's own slots are full
                continue
            found = requests.get(request_id)
            if found is None or found.model_id != d.model_id or request_id in accepted:
                continue  # gone, of another model, or named twice: sent once
            busy[d.server_id] += 1
            if d.id in own_room:
                own_room[d.id] -= 1
            accepted[request_id] = d
        now = timezone.now()  # once the slots are ours: as near the send as the row can tell
        fields = {"started_at": now, "worker_id": worker_id, "attempts": sql.Increment()}
        sending = [
            Transition(
                request_id,
                (State.READY,),
                State.PROCESSING,
                reason,
                {**fields, "deployment_id": d.id, "server_id": d.server_id},
                at_server=d.server_name,
            )
            for request_id, d in accepted.items()
        ]
        moved = move_all([_via(routes.get(t.request_id), t) for t in sending], locked)
        sent = {
            request_id: d for (request_id, d), ok in zip(accepted.items(), moved, strict=True) if ok
        }
        for deployment_id in {d.id for d in sent.values()}:
            mine = [requests[rid].priority for rid, d in sent.items() if d.id == deployment_id]
            _deployment_used(deployment_id, now, mine)
        for request_id, _ in sends:
            d = sent.pop(request_id, None)  # a request named twice gets one job
            if d is None:
                jobs.append(None)
                continue
            r = requests[request_id]
            payload = json.loads(r.payload)
            call = InferenceCall(r.kind, d.server_model_id, payload, bool(r.stream), d.load_options)
            jobs.append(ServeJob(request_id, d.id, d.server_id, d.server_name, worker_id, call))
        if send_now is not None and any(jobs):
            send_now([job for job in jobs if job is not None])
    return jobs


def _via(route: Transition | None, send: Transition) -> Transition:
    """The send, made together with the request's route when it has one."""
    if route is None:
        return send
    fields = {**route.fields, **send.fields}
    return dataclasses.replace(send, from_states=route.from_states, fields=fields, via=route)


def _deployment_used(deployment_id: int, now: datetime, priorities: list[int]) -> None:
    """Count requests sent to the deployment; remember when, and for which classes."""
    used: dict[str, Any] = {
        "in_flight": sql.Increment(len(priorities)),
        "last_used_at": now,
        "last_priority": priorities[-1],
    }
    if Priority.INTERACTIVE in priorities:
        used["last_interactive_at"] = now
    changes, params = sql.assignments(Deployment, used)
    sql.write_later(
        sql.prepared(f"UPDATE {DEPLOYMENTS} SET {changes} WHERE id = %s"), [*params, deployment_id]
    )


def move_and_dispatch(
    transitions: list[Transition],
    sends: list[tuple[Any, int]],
    worker_id: int,
    send_now: Sending | None = None,
) -> tuple[list[bool], list[ServeJob | None]]:
    """`move_all`, then `dispatch_all`, in one transaction: a request routed and sent in the
    same pass costs one commit, and one UPDATE of its row. Unless it ends a request (an
    expiry, a failure), that commit may skip the disk's flush (`SWITCHYARD_SKIP_FLUSH`):
    should a database crash lose it, each request is back where the pass found it and is
    planned again (one already sent is sent again, as after a worker's crash, whose fate
    the crash gives this worker: see `requests_completed`)."""
    to_send = {request_id for request_id, _ in sends}
    routed_ready = (t for t in transitions if t.to_state == State.READY)
    routes = {
        t.request_id: t
        for t in routed_ready
        if t.from_states == (State.PENDING,) and t.request_id in to_send
    }
    others = [t for t in transitions if routes.get(t.request_id) is not t]
    with sql.atomic():
        if not any(t.to_state in TERMINAL_STATES for t in transitions):
            sql.without_waiting_for_disk()
        if others and sends:
            # The lock order (servers, deployments, requests): the rows the moves take are
            # locked after the slots the sends need, with the sends' own (all in id order:
            # the sends' left for later would be taken out of it), in one round trip.
            moved = [t.request_id for t in transitions]
            _lock_in_order([did for _, did in sends], moved + [rid for rid, _ in sends])
        done = dict(zip(map(id, others), move_all(others), strict=True))
        jobs = dispatch_all(sends, worker_id, routes, send_now)
        sent = {job.request_id for job in jobs if job is not None}
        done |= {id(t): True for rid, t in routes.items() if rid in sent}
        # A route whose request was not sent after all (its slot taken meanwhile) goes alone.
        unsent = [t for rid, t in routes.items() if rid not in sent]
        done |= zip(map(id, unsent), move_all(unsent), strict=True)
    return [done[id(t)] for t in transitions], jobs


def _lock_in_order(deployment_ids: list[int], request_ids: list[Any]) -> None:
    """Lock, in the one lock order, the servers of these deployments, their deployments and
    these requests (in id order)."""
    ids = sorted(set(deployment_ids))
    keys = sql.keys(Request, dict.fromkeys(request_ids))
    sql.fetch_all([lock_servers(ids), servers_deployments(ids), locking("id", keys)])


def send_on_arrival(
    routes: list[Transition],
    sends: list[tuple[Any, int]],
    worker_id: int,
    send_now: Sending | None = None,
) -> list[ServeJob | None]:
    """New requests routed and sent as they arrived, in one transaction (which may skip the
    disk's flush, as `move_and_dispatch`): each one sent, or left pending for a pass."""
    with sql.atomic():
        sql.without_waiting_for_disk()
        return dispatch_all(sends, worker_id, {t.request_id: t for t in routes}, send_now)

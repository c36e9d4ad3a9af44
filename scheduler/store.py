"""The runtime's database side: reading the snapshot and committing what tasks report.

All functions are synchronous; the runtime calls them in its database thread
(`database_thread`).
"""

import dataclasses
import functools
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget, ServerModel
from backends.models import (
    Deployment,
    DeploymentState,
    Health,
    Model,
    ModelType,
    Server,
    merged_load_options,
)

from . import announce, sql
from .models import TERMINAL_STATES, WAITING_STATES, Priority, Request, State, Worker
from .retry import backoff_s
from .snapshot import DeploymentView, PolicyConfig, RequestView, ServerView, Snapshot
from .transitions import Locked, Transition, end_later, locking, move, move_all

log = logging.getLogger(__name__)
DS = DeploymentState
SNAPSHOT_HEAD = 250  # waiting requests read per ordering; see SnapshotReader
MODEL_HEAD = 50  # and the best of each deployed model's own line
ROWS_PER_READ = 500  # ids in one IN list, within SQLite's limit on parameters
SERVERS = Server._meta.db_table
DEPLOYMENTS = Deployment._meta.db_table
MODELS = Model._meta.db_table
REQUESTS = Request._meta.db_table


def knob(name: str) -> Any:
    return settings.SWITCHYARD[name]


def policy_config() -> PolicyConfig:
    return PolicyConfig(
        aging_step_s=knob("AGING_STEP_S"),
        min_residency_s=knob("MIN_RESIDENCY_S"),
        warm_window_s=knob("WARM_WINDOW_S"),
        activity_window_s=knob("ACTIVITY_WINDOW_S"),
        parallel_load_queue=knob("PARALLEL_LOAD_QUEUE"),
    )


# -- snapshot ----------------------------------------------------------------------------


SERVER_VIEW_SQL = sql.prepared(
    "SELECT id, name, slots, max_llm, max_embedding, max_reranking, memory_mb, enabled,"
    f" health, cooldown_until FROM {SERVERS} ORDER BY name"
)
# Every DeploymentView field is the deployment's column of that name, but for its model's.
DEPLOYMENT_VIEW_SQL = sql.prepared(
    "SELECT d.model_id, "
    + ", ".join(
        {"model": "m.name", "model_type": "m.type"}.get(f.name, f"d.{f.name}")
        for f in dataclasses.fields(DeploymentView)
    )
    + f" FROM {DEPLOYMENTS} d JOIN {MODELS} m ON m.id = d.model_id"
    f" JOIN {SERVERS} s ON s.id = d.server_id ORDER BY s.name, m.name"
)
# In key order: with sequential scans off (IN_INDEX_ORDER), a read with no order to give
# an index is planned as a disabled scan, at a cost that has PostgreSQL compile it (JIT,
# 14 ms a read).
MODEL_NAMES_SQL = sql.prepared(f"SELECT id, name FROM {MODELS} ORDER BY id")
# A RequestView's columns but its model's name (the models are read apart: one table to
# plan on every pass, not a join); timestamps as text, which `datetime.fromisoformat`
# parses many times faster than the driver's loader (most of a deep snapshot's cost).
REQUEST_VIEW_SQL = (
    "SELECT r.id, r.model_id, r.priority, r.state, CAST(r.created_at AS TEXT),"
    f" CAST(r.expires_at AS TEXT), r.deployment_id, CAST(r.not_before AS TEXT) FROM {REQUESTS} r"
)
WAITING_SQL = f"r.state IN ({sql.marks(len(WAITING_STATES))})"
RANK_SQL = "r.priority, r.created_at, r.id"  # best first, as the policy ranks before aging
AGE_SQL = "r.created_at, r.id"  # oldest first
# The heads are read by walking a partial index of waiting requests in order, stopping at
# the limit. A bitmap or sequential scan would visit every entry the index still holds, and
# the entries of requests that moved on stay until a vacuum removes them: with autovacuum
# off or behind (or no statistics yet, which is when PostgreSQL picks a bitmap scan here),
# every pass read every request that ever waited: 8,500 entries, 2.9 ms, after 8,500.
# An index scan also marks the dead entries it passes, so the next pass skips them.
IN_INDEX_ORDER = [("SET LOCAL enable_bitmapscan = off", []), ("SET LOCAL enable_seqscan = off", [])]
# The head of the line. Not prepared: a cached plan made while the waiting index was
# bloated and the line short sorts the line through the index of states (seen: a Sort over
# `request_state`), and would go on sorting it, grown to 100,000, until the next ANALYZE.
HEAD_SQL = f"{REQUEST_VIEW_SQL} WHERE {WAITING_SQL} ORDER BY {RANK_SQL} LIMIT %s"


class SnapshotReader:
    """Reads what the policy plans on, pass after pass: every server and deployment, and
    the head of the line. Read as SQL written once, as the ORM would return it (this runs
    on every pass), in one round trip: the servers, the deployments, the best-ranked
    waiting requests and, when the last pass found the line deep, its other heads too."""

    def __init__(self) -> None:
        # The deployed models whose heads the last pass read: the line was deep then.
        self.deep_models: tuple[int, ...] | None = None

    def read(self, config: PolicyConfig) -> Snapshot:
        statements = pass_reads()
        if self.deep_models is not None:
            statements.append(_other_heads(self.deep_models))
        server_rows, deployment_rows, model_rows, head, *other_heads = _read_heads(statements)
        names = dict(model_rows)
        # The best-ranked and the oldest waiting requests: enough to plan every free slot
        # and load, and the oldest are where aging and expiry happen. Deep queues stay cheap.
        requests = {view.id: view for view in _request_views(head, names)}
        if len(requests) < SNAPSHOT_HEAD:  # that was every waiting request
            self.deep_models = None
        else:
            models = tuple(sorted({row[0] for row in deployment_rows}))
            if models != self.deep_models:  # a line just grown deep, or a model deployed
                other_heads = _read_heads([_other_heads(models)])
            self.deep_models = models
            # The other views of the line come as ids, and only the rows not read yet are
            # read in full: most are the same rows.
            ids = list({sql.uuid_of(key) for (key,) in other_heads[0]} - requests.keys())
            for batch in sql.batches(ids, ROWS_PER_READ):
                keys = sql.keys(Request, batch)
                rows = sql.fetch(f"{REQUEST_VIEW_SQL} WHERE r.id IN ({sql.marks(len(keys))})", keys)
                requests.update((view.id, view) for view in _request_views(rows, names))
        return Snapshot(
            servers=_server_views(server_rows),
            deployments=tuple(
                DeploymentView(*(sql.aware(value) for value in row[1:])) for row in deployment_rows
            ),
            requests=tuple(requests.values()),
            config=config,
            unseen=frozenset() if self.deep_models is None else _unseen(requests.values()),
        )


def _unseen(heads: Iterable[RequestView]) -> frozenset[str]:
    """Of a deep line's heads, the models whose own head was full: more may wait for them."""
    counts = Counter(view.model for view in heads)
    return frozenset(model for model, n in counts.items() if n >= MODEL_HEAD)


def pass_reads() -> list[sql.Statement]:
    """What every pass reads, in this order (a deep line's other heads come after)."""
    return [
        (SERVER_VIEW_SQL, []),
        (DEPLOYMENT_VIEW_SQL, []),
        (MODEL_NAMES_SQL, []),
        (HEAD_SQL, [*WAITING_STATES, SNAPSHOT_HEAD]),
    ]


def _read_heads(statements: list[sql.Statement]) -> list[list[tuple]]:
    """The rows of each statement, read in index order (IN_INDEX_ORDER) on PostgreSQL: its
    settings hold for the one transaction the statements run in, implicit outside one."""
    if not settings.IS_POSTGRES:
        return sql.fetch_all(statements)
    return sql.fetch_all([*IN_INDEX_ORDER, *statements])[len(IN_INDEX_ORDER) :]


def _server_views(rows: list[tuple]) -> tuple[ServerView, ...]:
    return tuple(
        ServerView(
            id=sid,
            name=name,
            slots=slots,
            capacity={
                ModelType.LLM: max_llm,
                ModelType.EMBEDDING: max_embedding,
                ModelType.RERANKING: max_reranking,
            },
            memory_mb=memory_mb,
            enabled=bool(enabled),
            health=health,
            cooldown_until=sql.aware(cooldown_until),
        )
        for (
            sid,
            name,
            slots,
            max_llm,
            max_embedding,
            max_reranking,
            memory_mb,
            enabled,
            health,
            cooldown_until,
        ) in rows
    )


def _request_views(rows: list[tuple], names: dict[int, str]) -> Iterator[RequestView]:
    return (_request_view(row, names.get(row[1], "")) for row in rows)


@functools.lru_cache(maxsize=4 * SNAPSHOT_HEAD)
def _request_view(row: tuple, model: str) -> RequestView:
    """The view of a row as read (kept: a deep line's head is mostly the same rows, unchanged,
    pass after pass, and building a view costs more than finding it)."""
    rid, _, priority, state, created_at, expires_at, deployment_id, not_before = row
    return RequestView(
        id=sql.uuid_of(rid),
        model=model,
        priority=priority,
        state=state,
        created_at=sql.timestamp(created_at),
        expires_at=sql.timestamp(expires_at),
        deployment_id=deployment_id,
        not_before=sql.timestamp(not_before),
    )


def _other_heads(models: tuple[int, ...]) -> sql.Statement:
    """With a deep line, in one statement, the ids of the oldest waiting requests, of the
    oldest routed ones, and of each deployed model's `MODEL_HEAD` best: a model that can be
    served now is seen now, and does not hide behind a deep line for other models (a long
    load, a server down)."""
    routed = "r.state IN (%s, %s)"
    heads = [
        (WAITING_SQL, AGE_SQL, [*WAITING_STATES], SNAPSHOT_HEAD),
        (routed, AGE_SQL, [State.READY, State.NEEDS_LOADING], SNAPSHOT_HEAD),
    ]
    heads += [
        (f"{WAITING_SQL} AND r.model_id = %s", RANK_SQL, [*WAITING_STATES, m], MODEL_HEAD)
        for m in models
    ]
    # Each head a subquery: SQLite takes no ORDER BY or LIMIT in a UNION's parts themselves.
    statement = " UNION ALL ".join(
        f"SELECT id FROM (SELECT r.id FROM {REQUESTS} r WHERE {where} ORDER BY {order} LIMIT %s)"
        f" AS head{i}"
        for i, (where, order, _, _) in enumerate(heads)
    )
    return statement, [p for _, _, values, limit in heads for p in (*values, limit)]


# -- workers -----------------------------------------------------------------------------


def register_worker() -> int:
    return Worker.objects.create(host=socket.gethostname(), pid=os.getpid()).pk


def heartbeat(worker_id: int) -> bool:
    return Worker.objects.filter(pk=worker_id).update(last_heartbeat=timezone.now()) == 1


def take_over_stale_workers(stale_s: float, me: int | None = None) -> tuple[int, list[int]]:
    """Take back what workers with a stale heartbeat held, and what no worker holds.

    Requests they were processing go back to pending (they run again). Returns how many
    requests moved and the deployments whose load or unload was under way, to be
    re-checked with their servers."""
    cutoff = timezone.now() - timedelta(seconds=stale_s)
    stale = list(
        Worker.objects.filter(last_heartbeat__lt=cutoff).exclude(pk=me).values_list("pk", flat=True)
    )
    if stale:
        log.warning("taking over the work of stale workers %s", stale)
    Worker.objects.filter(pk__in=stale).delete()  # what they held now points at no worker
    return release_orphans("its worker stopped heartbeating; it will run again")


def release_worker(worker_id: int) -> tuple[int, list[int]]:
    """A worker stopping cleanly hands back what it holds, like a stale one."""
    Worker.objects.filter(pk=worker_id).delete()
    return release_orphans("its worker stopped; it will run again")


def release_orphans(reason: str) -> tuple[int, list[int]]:
    orphans = Request.objects.filter(state=State.PROCESSING, worker__isnull=True)
    back = {"deployment": None, "server": None}
    moved = sum(
        move_all(
            [
                Transition(
                    request_id, (State.PROCESSING,), State.PENDING, reason, back, server or ""
                )
                for request_id, server in orphans.values_list("pk", "server__name")
            ]
        )
    )
    if moved:
        recount_in_flight()
    return moved, orphaned_deployments()


def recount_in_flight() -> None:
    """Set every deployment's in-flight count from the requests processing there, in one
    statement so that a concurrent dispatch is never overwritten."""
    processing = (
        Request.objects.filter(deployment=OuterRef("pk"), state=State.PROCESSING)
        .order_by()
        .values("deployment")
        .annotate(n=Count("pk"))
        .values("n")
    )
    Deployment.objects.update(in_flight=Coalesce(Subquery(processing), 0))


def orphaned_deployments() -> list[int]:
    """Loads or unloads under way that no live worker holds (e.g. after a crash)."""
    return list(
        Deployment.objects.filter(
            state__in=(DS.LOADING, DS.UNLOADING), worker__isnull=True
        ).values_list("pk", flat=True)
    )


# -- loads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadJob:
    deployment_id: int
    server_id: int
    server_name: str
    model_name: str
    worker_id: int
    target: LoadTarget
    evict: tuple[tuple[int, str], ...]  # (deployment id, server model id)


def start_load(deployment_id: int, evict: tuple[int, ...], worker_id: int, reason: str):
    now = timezone.now()
    server_id = Deployment.objects.values_list("server_id", flat=True).get(pk=deployment_id)
    with transaction.atomic():
        # Lock the server row: two workers never start loads on the same server at once.
        Server.objects.select_for_update().filter(pk=server_id).first()
        busy = Deployment.objects.filter(
            server_id=server_id, state__in=(DS.LOADING, DS.UNLOADING)
        ).exists()
        if busy:
            return None
        claimed = Deployment.objects.filter(
            pk=deployment_id, state__in=(DS.UNLOADED, DS.FAILED)
        ).update(
            state=DS.LOADING,
            state_changed_at=now,
            load_started_at=now,
            load_progress=0.0,
            worker_id=worker_id,
            last_used_at=now,
        )
        if not claimed:
            return None
        for victim in evict:
            if not Deployment.objects.filter(pk=victim, state=DS.LOADED, in_flight=0).update(
                state=DS.UNLOADING, state_changed_at=now, worker_id=worker_id
            ):
                transaction.set_rollback(True)
                return None
        d = Deployment.objects.select_related("model", "server").get(pk=deployment_id)
        victims = tuple(
            Deployment.objects.filter(pk__in=evict).values_list("pk", "server_model_id")
        )
    transaction.on_commit(announce.dashboard_changed)
    log.info(
        "loading %s on %s (%s)%s",
        d.model.name,
        d.server.name,
        reason,
        f", evicting {[v[1] for v in victims]}" if victims else "",
    )
    return LoadJob(
        deployment_id=d.pk,
        server_id=d.server_id,
        server_name=d.server.name,
        model_name=d.model.name,
        worker_id=worker_id,
        target=LoadTarget(
            d.server_model_id,
            d.model.type,
            d.effective_load_options(),
            float(d.model.load_timeout_s),
        ),
        evict=victims,
    )


def evicted(deployment_id: int) -> None:
    Deployment.objects.filter(pk=deployment_id).update(
        state=DS.UNLOADED,
        state_changed_at=timezone.now(),
        worker=None,
        loaded_at=None,
        load_progress=None,
    )
    announce.dashboard_changed()


def start_unload(deployment_id: int, worker_id: int) -> tuple[int, str] | None:
    if not Deployment.objects.filter(pk=deployment_id, state=DS.LOADED, in_flight=0).update(
        state=DS.UNLOADING, state_changed_at=timezone.now(), worker_id=worker_id
    ):
        return None
    d = Deployment.objects.get(pk=deployment_id)
    return d.server_id, d.server_model_id


def set_load_progress(deployment_id: int, fraction: float) -> None:
    Deployment.objects.filter(pk=deployment_id, state=DS.LOADING).update(load_progress=fraction)
    announce.dashboard_changed()


def load_succeeded(job: LoadJob, seconds: float) -> None:
    now = timezone.now()
    d = Deployment.objects.get(pk=job.deployment_id)
    avg = seconds if d.avg_load_s is None else 0.7 * d.avg_load_s + 0.3 * seconds
    mine = Deployment.objects.filter(pk=job.deployment_id, state=DS.LOADING, worker=job.worker_id)
    mine.update(
        state=DS.LOADED,
        state_changed_at=now,
        loaded_at=now,
        last_used_at=now,
        load_progress=1.0,
        avg_load_s=avg,
        load_failures=0,
        next_load_at=None,
        last_error="",
        last_error_code="",
        worker=None,
    )
    log.info("loaded %s in %.1f s", d, seconds)
    announce.dashboard_changed()


def load_failed(job: LoadJob, error: AdapterError) -> None:
    """Back off and retry, or give up: `failed` when attempts are spent or it is not found."""
    d = Deployment.objects.get(pk=job.deployment_id)
    failures = d.load_failures + 1
    permanent = error.code == ErrorCode.NOT_FOUND or failures >= knob("LOAD_ATTEMPTS")
    delay = backoff_s(failures, knob("RETRY_BASE_S"), knob("RETRY_MAX_S"))
    Deployment.objects.filter(pk=job.deployment_id, state=DS.LOADING, worker=job.worker_id).update(
        state=DS.FAILED if permanent else DS.UNLOADED,
        state_changed_at=timezone.now(),
        load_failures=0 if permanent else failures,
        next_load_at=None if permanent else timezone.now() + timedelta(seconds=delay),
        last_error=error.message[:2000],
        last_error_code=error.code
        if error.code == ErrorCode.NOT_FOUND
        else ("load_failed" if permanent else error.code),
        load_progress=None,
        worker=None,
    )
    log.warning(
        "loading %s failed (%s): %s%s",
        d,
        error.code,
        error.message,
        "; giving up" if permanent else f"; retrying in {delay:.0f} s",
    )
    announce.dashboard_changed()


# -- requests ----------------------------------------------------------------------------


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


def _servers_of(deployment_ids: list[int]) -> str:
    return f"SELECT server_id FROM {DEPLOYMENTS} WHERE id IN ({sql.marks(len(deployment_ids))})"


def _lock_servers(deployment_ids: list[int]) -> sql.Statement:
    """Lock the servers of these deployments (in id order, so that workers never deadlock);
    their slots, none for a server taken out of service since it was planned for (disabled,
    down, in cooldown): a plan may be as old as the inference whose end it waited for."""
    return (
        sql.prepared(
            f"SELECT id, CASE WHEN enabled AND health NOT IN"
            f" ('{Health.DOWN.value}', '{Health.COOLDOWN.value}') THEN slots ELSE 0 END"
            f" FROM {SERVERS} WHERE id IN ({_servers_of(deployment_ids)})"
            f" ORDER BY id{sql.for_update()}"
        ),
        deployment_ids,
    )


def _servers_deployments(deployment_ids: list[int]) -> sql.Statement:
    """Then every deployment of those servers, locked too (one found loaded stays loaded
    until commit), with its requests in flight. Run after the servers' lock is held (the
    next statement of the same query), so that a dispatch that held it is counted."""
    return (
        sql.prepared(
            f"SELECT d.id, d.model_id, d.server_id, s.name, d.server_model_id, m.load_options,"
            f" d.load_options, d.state, d.in_flight"
            f" FROM {DEPLOYMENTS} d JOIN {SERVERS} s ON s.id = d.server_id"
            f" JOIN {MODELS} m ON m.id = d.model_id WHERE d.server_id IN"
            f" ({_servers_of(deployment_ids)}) ORDER BY d.id{sql.for_update('d')}"
        ),
        deployment_ids,
    )


def _loaded(
    slots: dict[int, int], rows: list[tuple]
) -> tuple[dict[int, int], dict[int, LoadedDeployment]]:
    """Each server's requests in flight, and its loaded deployments."""
    busy = dict.fromkeys(slots, 0)
    loaded = {}
    for did, model_id, server_id, name, server_model_id, defaults, own, state, in_flight in rows:
        busy[server_id] += in_flight
        if state == DS.LOADED:
            options = merged_load_options(json.loads(defaults), json.loads(own))
            loaded[did] = LoadedDeployment(did, model_id, server_id, name, server_model_id, options)
    return busy, loaded


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
    the commit (see `Runtime.committed`)."""
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
                _lock_servers(deployment_ids),
                _servers_deployments(deployment_ids),
                # Locked too: the moves below are then known, and go with the commit.
                locking("id, model_id, priority, payload, kind, stream, state, worker_id", keys),
            ]
        )
        slots = dict(server_rows)
        busy, deployments = _loaded(slots, deployment_rows)
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
            found = requests.get(request_id)
            if found is None or found.model_id != d.model_id or request_id in accepted:
                continue  # gone, of another model, or named twice: sent once
            busy[d.server_id] += 1
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
    expiry, a failure), that commit does not wait for the disk either: should a database
    crash lose it, each request is back where the pass found it and is planned again (one
    already sent is sent again, as after a worker's crash, whose fate the crash gives this
    worker: see `requests_completed`)."""
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
        done = dict(zip(map(id, others), move_all(others), strict=True))
        jobs = dispatch_all(sends, worker_id, routes, send_now)
        sent = {job.request_id for job in jobs if job is not None}
        done |= {id(t): True for rid, t in routes.items() if rid in sent}
        # A route whose request was not sent after all (its slot taken meanwhile) goes alone.
        unsent = [t for rid, t in routes.items() if rid not in sent]
        done |= zip(map(id, unsent), move_all(unsent), strict=True)
    return [done[id(t)] for t in transitions], jobs


def send_on_arrival(
    routes: list[Transition],
    sends: list[tuple[Any, int]],
    worker_id: int,
    send_now: Sending | None = None,
) -> list[ServeJob | None]:
    """New requests routed and sent as they arrived, in one transaction (not waiting for the
    disk, as `move_and_dispatch`): each one sent, or left pending for a pass."""
    with sql.atomic():
        sql.without_waiting_for_disk()
        return dispatch_all(sends, worker_id, {t.request_id: t for t in routes}, send_now)


def _release(
    deployment_id: int, seconds: float | None = None, only_if: sql.Statement | None = None
) -> None:
    """Free the slot of a request that finished on the deployment; `seconds`, its inference
    time if it completed, goes into the moving average. `only_if`: an SQL condition the
    write waits on (a request's end sent in the same round trip)."""
    changes = "in_flight = CASE WHEN in_flight > 0 THEN in_flight - 1 ELSE 0 END, last_used_at = %s"
    params: list[Any] = [sql.db_value(Deployment, "last_used_at", timezone.now())]
    if seconds is not None:
        # With no average yet (NULL propagates), COALESCE takes this measurement alone.
        changes += ", avg_inference_s = COALESCE(0.8 * avg_inference_s + %s, %s)"
        params += [0.2 * seconds, seconds]
    statement = f"UPDATE {DEPLOYMENTS} SET {changes} WHERE id = %s"
    params.append(deployment_id)
    if only_if is not None:
        statement += f" AND {only_if[0]}"
        params += only_if[1]
    sql.write_later(sql.prepared(statement), params)


@dataclass(frozen=True)
class Answer:
    job: ServeJob
    result: dict
    seconds: float
    # The request planned for the slot this answer frees (a pass's `SendNext`): (request,
    # deployment).
    then_send: tuple[Any, int] | None = None


def requests_completed(answers: list[Answer], send_now: Sending | None = None) -> list[bool]:
    """Store the results, in one transaction (on PostgreSQL, one round trip), and send the
    requests planned for the slots they free, given to `send_now` as `dispatch_all` does
    (two more round trips: the sends read the freed slots). False for a request taken from
    this worker meanwhile; its slot is not ours to fill.

    The commit does not wait for the disk (a flush was about a millisecond of every
    answer's wait here): should a crash of the database lose it, the request is back in
    `processing` under a worker whose connection died with the database. That worker exits
    (`run_scheduler`), and whoever takes its work over runs the request again."""
    sends = [a.then_send for a in answers if a.then_send is not None]
    with sql.atomic():
        sql.without_waiting_for_disk()
        if sends:
            # Servers before deployments, as every dispatch locks them: no two workers wait
            # for each other.
            deployments = {did for _, did in sends} | {a.job.deployment_id for a in answers}
            sql.write_later(*_lock_servers(sorted(deployments)))
        ends = []
        for a in answers:
            end = end_later(
                Transition(
                    a.job.request_id,
                    (State.PROCESSING,),
                    State.COMPLETED,
                    f"completed in {a.seconds:.2f} s",
                    {"result": a.result},
                    at_server=a.job.server_name,
                    held_by=a.job.worker_id,
                ),
                notify_origin=not a.job.call.stream,
            )
            _release(a.job.deployment_id, a.seconds, only_if=end.condition)
            ends.append(end)
        if sends:
            sql.send_held_writes()
            # An end made was held by its job's worker id, which is then this worker's own.
            made = [
                (a.job.worker_id, a.then_send)
                for a, end in zip(answers, ends, strict=True)
                if end.made and a.then_send is not None
            ]
            if made:
                dispatch_all(
                    [send for _, send in made],
                    made[0][0],
                    send_now=send_now,
                    reason="sent to the server as a slot freed there",
                )
    return [end.made for end in ends]


def request_failed(job: ServeJob, error: AdapterError, may_retry: bool = True) -> str:
    """Retry with backoff, re-route if the model went away, or fail. Returns the new state.

    `may_retry` is False once part of a streamed answer reached the caller: running it again
    would send the caller a second beginning."""
    attempts = Request.objects.values_list("attempts", flat=True).get(pk=job.request_id)
    attempts_left = may_retry and attempts < knob("REQUEST_ATTEMPTS")
    with transaction.atomic():
        if error.code == ErrorCode.NOT_LOADED and attempts_left:
            Deployment.objects.filter(pk=job.deployment_id, state=DS.LOADED).update(
                state=DS.UNLOADED, state_changed_at=timezone.now(), loaded_at=None
            )
            state = State.PENDING
            reason = f"the server no longer has the model loaded ({error.message}); routing again"
            fields: dict[str, Any] = {"deployment": None, "server": None, "worker": None}
        elif error.retryable and attempts_left:
            delay = error.retry_after_s or backoff_s(
                attempts, knob("RETRY_BASE_S"), knob("RETRY_MAX_S")
            )
            state = State.READY
            reason = f"{error.code}: {error.message}; retry {attempts + 1} in {delay:.2f} s"
            fields = {"not_before": timezone.now() + timedelta(seconds=delay), "worker": None}
        else:
            state = State.FAILED
            reason = f"{error.code}: {error.message}"
            if error.retryable and not may_retry:
                reason += " (the stream had begun: not retried)"
            elif error.retryable:
                reason += f" (after {attempts} attempts)"
            fields = {"error": error.message[:4000], "error_code": error.code}
        moved = move(
            job.request_id,
            [State.PROCESSING],
            state,
            reason,
            job.server_name,
            held_by=job.worker_id,
            **fields,
        )
        if moved:
            _release(job.deployment_id)
    if error.server_fault:
        server_failed(job.server_id, error.message)
    return state if moved else "taken over"


# -- servers -----------------------------------------------------------------------------


def server_succeeded(server_id: int) -> None:
    """Healthy again, seen now. `last_seen` is refreshed at most once a second, so that busy
    servers' rows are not rewritten (and locked) on every completion."""
    now = timezone.now()
    Server.objects.filter(pk=server_id).filter(
        ~Q(health=Health.UP)
        | ~Q(consecutive_failures=0)
        | Q(last_seen__isnull=True)
        | Q(last_seen__lt=now - timedelta(seconds=1))
    ).update(
        health=Health.UP, consecutive_failures=0, cooldown_until=None, last_error="", last_seen=now
    )


def server_failed(server_id: int, message: str) -> None:
    """Count a failure; the breaker opens after BREAKER_FAILURES in a row."""
    Server.objects.filter(pk=server_id).update(
        consecutive_failures=F("consecutive_failures") + 1, last_error=message[:2000]
    )
    server = Server.objects.get(pk=server_id)
    if server.consecutive_failures >= knob("BREAKER_FAILURES") and server.health != Health.COOLDOWN:
        open_breaker(server, f"{server.consecutive_failures} failures in a row: {message}")


def open_breaker(server: Server, reason: str) -> None:
    until = timezone.now() + timedelta(seconds=knob("BREAKER_COOLDOWN_S"))
    Server.objects.filter(pk=server.pk).update(health=Health.COOLDOWN, cooldown_until=until)
    log.warning("server %s in cooldown until %s: %s", server.name, until.isoformat(), reason)
    announce.dashboard_changed()


def probe_result(server_id: int, error: AdapterError | None) -> None:
    server = Server.objects.get(pk=server_id)
    if error is None:
        Server.objects.filter(pk=server_id).update(
            health=Health.UP,
            consecutive_failures=0,
            cooldown_until=None,
            last_seen=timezone.now(),
            last_error="",
        )
        log.info("server %s answered its probe: healthy again", server.name)
        announce.dashboard_changed()
    else:
        open_breaker(server, f"probe failed: {error.message}")


def mark_down(server_id: int, message: str) -> None:
    changed = Server.objects.filter(pk=server_id).exclude(health__in=(Health.DOWN, Health.COOLDOWN))
    if changed.update(health=Health.DOWN, last_error=message[:2000]):
        log.warning("server %s is down: %s", server_id, message)
        announce.dashboard_changed()


def apply_server_models(server_id: int, listed: list[ServerModel], asked_at: datetime) -> list[str]:
    """Correct deployment states from what the server reported when asked at `asked_at`;
    returns what changed. A deployment whose state changed after the question (a load that
    finished meanwhile) is left alone: the answer is older than what we know."""
    now = timezone.now()
    was_down = Server.objects.filter(pk=server_id, health=Health.DOWN).exists()
    Server.objects.filter(pk=server_id).exclude(health=Health.COOLDOWN).update(
        health=Health.UP, last_seen=now, last_error=""
    )
    loaded = {m.id for m in listed if m.state == "loaded"}
    changes = []
    settled = Deployment.objects.filter(
        server_id=server_id, state__in=(DS.LOADED, DS.UNLOADED), state_changed_at__lt=asked_at
    )
    for d in settled:
        if d.state == DS.LOADED and d.server_model_id not in loaded and d.in_flight == 0:
            Deployment.objects.filter(pk=d.pk, state=DS.LOADED, in_flight=0).update(
                state=DS.UNLOADED, state_changed_at=now, loaded_at=None
            )
            changes.append(f"{d.server_model_id} was unloaded outside Switchyard")
        elif d.state == DS.UNLOADED and d.server_model_id in loaded:
            Deployment.objects.filter(pk=d.pk, state=DS.UNLOADED).update(
                state=DS.LOADED, state_changed_at=now, loaded_at=now, last_used_at=now
            )
            changes.append(f"{d.server_model_id} was loaded outside Switchyard")
    if changes or was_down:
        log.info("status sync of server %s: %s", server_id, "; ".join(changes) or "back up")
        announce.dashboard_changed()
    return changes


def recheck_deployment(
    deployment_id: int, listed: list[ServerModel] | None, held_by: int | None = None
) -> None:
    """A load or unload that nobody finished (its worker died or it failed halfway): trust
    what the server says now. Only while it is still under way and held by `held_by` (no
    worker: an orphan), so that a load another worker started meanwhile is left alone."""
    d = Deployment.objects.get(pk=deployment_id)
    is_loaded = listed is not None and any(
        m.id == d.server_model_id and m.state == "loaded" for m in listed
    )
    now = timezone.now()
    under_way = Deployment.objects.filter(pk=deployment_id, state__in=(DS.LOADING, DS.UNLOADING))
    if held_by is None:
        under_way = under_way.filter(worker__isnull=True)
    else:
        under_way = under_way.filter(worker_id=held_by)
    under_way.update(
        state=DS.LOADED if is_loaded else DS.UNLOADED,
        state_changed_at=now,
        worker=None,
        loaded_at=now if is_loaded else None,
        load_progress=None,
    )


def all_servers() -> list[Server]:
    return list(Server.objects.all())


def server_by_id(server_id: int) -> Server:
    return Server.objects.get(pk=server_id)

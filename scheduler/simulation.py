"""A discrete-event simulation of the real policy on a trace, and a serial FIFO baseline.

Nothing sleeps: a virtual clock jumps from one event to the next. The policy side mirrors what
the runtime does with `plan(snapshot, now)`: at every instant something happens (an arrival, a
load or unload finishing, a request finishing, the time a `Defer` asked for) it plans and
executes decisions as compare-and-set moves until a pass changes nothing. Loads take the
model's load time (after the evictions' unloads), requests take their `duration_s`, whatever
else runs on the server at the same time.

The baseline is the plain way: one queue in arrival order and one worker that, for each
request, loads its model if no server holds it (evicting the least recently used model that
must go) and then serves it, inline.

Both sides count a wait from arrival to the moment the request is sent to a server; a request
still waiting when its class's max wait runs out is expired, and its wait is that max wait.

Simulated servers never fail and deployments have no idle TTL, pinning or preload, so the
policy's retry, cooldown and housekeeping paths are not exercised here. They can stop a load
(`StopLoad`, a load nobody waits for any more): its end is dropped, and it is unloaded after
the trace's `unload_s`.
"""

import heapq
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from uuid import UUID

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
    StopLoad,
    Unload,
)
from .eta_accuracy import Accuracy
from .load_estimate import model_name, with_expected_loads
from .policy import plan
from .simulation_eta import EtaBook
from .simulation_workload import INTERACTIVE, ModelSpec, Workload
from .snapshot import DeploymentView, PolicyConfig, RequestView, ServerView, Snapshot

TERMINAL = ("completed", "expired", "failed")
MAX_PASSES_PER_INSTANT = 200  # more means the policy undoes its own decisions in a loop


class PolicyLivelock(RuntimeError):
    """The policy kept changing things at one instant without ever settling."""


@dataclass(slots=True)
class Outcome:
    priority: int
    state: str  # completed, expired or failed
    wait_s: float


@dataclass
class Result:
    name: str
    accepted: int
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    loads: int = 0
    stopped: int = 0  # loads stopped because nobody waited for them any more
    restores: int = 0  # loads started by a restore on idle (nobody asked for them)
    passes: int = 0
    dropped: int = 0  # decisions whose compare-and-set failed
    eta: Accuracy = field(default_factory=Accuracy)  # the ETA given on arrival, checked

    @property
    def lost(self) -> int:
        """Accepted but never completed, expired or failed: must be 0."""
        return self.accepted - sum(1 for o in self.outcomes.values() if o.state in TERMINAL)

    def count(self, state: str, priority: int | None = None) -> int:
        return sum(
            1
            for o in self.outcomes.values()
            if o.state == state and (priority is None or o.priority == priority)
        )

    def wait_percentile(self, priority: int, q: float) -> float | None:
        """Nearest-rank percentile of the waits of one class; None if it had no requests."""
        waits = sorted(o.wait_s for o in self.outcomes.values() if o.priority == priority)
        if not waits:
            return None
        return waits[max(math.ceil(q / 100 * len(waits)) - 1, 0)]


# -- the policy side -----------------------------------------------------------------------


def simulate_policy(trace: Workload, config: PolicyConfig | None = None) -> Result:
    return _PolicySimulation(trace, config or PolicyConfig()).run()


class _PolicySimulation:
    def __init__(self, trace: Workload, config: PolicyConfig) -> None:
        self.trace = trace
        self.config = config
        self.now = trace.start
        self.result = Result("policy", accepted=len(trace.requests))
        names = {s.name: i + 1 for i, s in enumerate(trace.servers)}
        self.servers = tuple(
            ServerView(
                id=names[s.name],
                name=s.name,
                slots=s.slots,
                capacity=dict(s.capacity),
                max_models=s.max_models,
                memory_mb=s.memory_mb,
                stops_loads=True,  # a load here is an event on the clock: it can be called off
            )
            for s in trace.servers
        )
        self.deployments: dict[int, DeploymentView] = {}
        self.model_of: dict[int, ModelSpec] = {}
        # Each deployment's load under way, by number: a stopped load's `loaded` event finds
        # another number (or none) and is dropped.
        self.load_number: dict[int, int] = {}
        self.loads_started = itertools.count(1)
        for m in trace.models:
            for server in m.servers:
                did = len(self.deployments) + 1
                self.deployments[did] = DeploymentView(
                    id=did,
                    server_id=names[server],
                    model=m.name,
                    model_type=m.type,
                    size_mb=m.size_mb,
                )
                self.model_of[did] = m
        self.waiting: dict[UUID, RequestView] = {}
        self.index: dict[UUID, int] = {}
        self.serving: dict[UUID, int] = {}
        self.events: list[tuple[datetime, int, str, object]] = []
        self.seq = itertools.count()
        self.wakes: set[datetime] = set()
        self.etas = EtaBook(config, trace.unload_s)
        self.result.eta = self.etas.accuracy
        self.arrived: list[UUID] = []

    def at(self, seconds: float) -> datetime:
        return self.trace.start + timedelta(seconds=seconds)

    def schedule(self, when: datetime, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, payload))

    # -- the loop --

    def run(self) -> Result:
        for i, r in enumerate(self.trace.requests):
            self.schedule(self.at(r.at), "arrive", i)
        while self.events:
            self.now = self.events[0][0]
            while self.events and self.events[0][0] == self.now:
                _, _, kind, payload = heapq.heappop(self.events)
                self.happen(kind, payload)
            if self.arrived:
                self.etas.give(self.arrived, self.now, self.servers, self.deployments, self.waiting)
                self.arrived.clear()
            self.plan_until_settled()
        return self.result

    def plan_until_settled(self) -> None:
        for _ in range(MAX_PASSES_PER_INSTANT):
            snapshot = Snapshot(
                self.servers,
                with_expected_loads(tuple(self.deployments.values()), model_name),
                tuple(self.waiting.values()),
                self.config,
            )
            self.result.passes += 1
            done = [d for d in plan(snapshot, self.now) if self.execute(d)]
            if not done:
                return
        raise PolicyLivelock(f"no settled plan at {self.now.isoformat()} after {done}")

    # -- events (what the tasks report) --

    def happen(self, kind: str, payload) -> None:
        if kind == "arrive":
            spec = self.trace.requests[payload]
            rid = UUID(int=payload + 1)
            self.index[rid] = payload
            self.waiting[rid] = RequestView(
                id=rid,
                model=spec.model,
                priority=spec.priority,
                state="pending",
                created_at=self.now,
                expires_at=self.now + timedelta(seconds=self.trace.max_wait_s[spec.priority]),
            )
            self.arrived.append(rid)
        elif kind == "wake":
            self.wakes.discard(self.now)
        elif kind == "unloaded":
            self.update(payload, state="unloaded", loaded_at=None)
        elif kind == "loaded":
            did, seconds, number = payload
            if self.load_number.get(did) != number:
                return  # that load was stopped
            del self.load_number[did]
            d = self.deployments[did]
            avg = seconds if d.avg_load_s is None else 0.7 * d.avg_load_s + 0.3 * seconds
            self.update(
                did, state="loaded", loaded_at=self.now, last_used_at=self.now, avg_load_s=avg
            )
            self.result.loads += 1
        elif kind == "finished":
            did = self.serving.pop(payload)
            d = self.deployments[did]
            self.etas.finished(payload, d.model, self.now)
            ran = self.trace.requests[self.index[payload]].duration_s
            avg = ran if d.avg_inference_s is None else 0.8 * d.avg_inference_s + 0.2 * ran
            self.update(did, in_flight=d.in_flight - 1, last_used_at=self.now, avg_inference_s=avg)
            self.result.outcomes[self.index[payload]].state = "completed"

    def update(self, deployment_id: int, **changes) -> None:
        self.deployments[deployment_id] = replace(self.deployments[deployment_id], **changes)

    # -- decisions (what the runtime executes) --

    def execute(self, decision: Decision) -> bool:
        match decision:
            case Defer(until=until):
                if until > self.now and until not in self.wakes:
                    self.wakes.add(until)
                    self.schedule(until, "wake")
                return False
            case Expire(request_id=rid) | Fail(request_id=rid):
                if rid not in self.waiting:
                    return self.drop()
                r = self.waiting.pop(rid)
                state = "expired" if isinstance(decision, Expire) else "failed"
                self.finish(r, state)
                return True
            case Route(request_id=rid, deployment_id=did, ready=ready):
                return self.move(rid, "pending", "ready" if ready else "needs_loading", did)
            case Requeue(request_id=rid):
                return self.move(rid, ("needs_loading", "ready"), "pending", None)
            case MarkReady(request_id=rid):
                r = self.waiting.get(rid)
                return self.move(rid, "needs_loading", "ready", r.deployment_id if r else None)
            case StartLoad(deployment_id=did, evict=evict, cause=cause):
                started = self.start_load(did, evict)
                if started:
                    self.update(did, load_cause=cause)
                    if cause == "restore":
                        self.result.restores += 1
                return started
            case Unload(deployment_id=did):
                d = self.deployments[did]
                if d.state != "loaded" or d.in_flight:
                    return self.drop()
                self.update(did, state="unloading")
                self.schedule(self.now + timedelta(seconds=self.trace.unload_s), "unloaded", did)
                return True
            case StopLoad(deployment_id=did):
                if self.deployments[did].state != "loading":
                    return self.drop()
                del self.load_number[did]
                self.update(did, state="unloading")
                self.schedule(self.now + timedelta(seconds=self.trace.unload_s), "unloaded", did)
                self.result.stopped += 1
                return True
            case Dispatch(request_id=rid, deployment_id=did):
                return self.dispatch(rid, did)
            case Probe():
                # Simulated servers never fail, so they are never in cooldown to probe.
                return False
            case SendNext() | SendOnArrival():
                # Here every finish and arrival is followed by a pass at the same instant,
                # which sends what the worker would have sent without one.
                return False
        raise TypeError(f"unknown decision {decision!r}")

    def drop(self) -> bool:
        self.result.dropped += 1
        return False

    def move(self, rid: UUID, from_: str | tuple, to: str, deployment_id: int | None) -> bool:
        r = self.waiting.get(rid)
        if r is None or r.state not in ((from_,) if isinstance(from_, str) else from_):
            return self.drop()
        self.waiting[rid] = replace(r, state=to, deployment_id=deployment_id)
        return True

    def start_load(self, did: int, evict: tuple[int, ...]) -> bool:
        d = self.deployments[did]
        victims = [self.deployments[v] for v in evict]
        if d.state not in ("unloaded", "failed") or any(
            v.state != "loaded" or v.in_flight for v in victims
        ):
            return self.drop()
        self.update(did, state="loading", last_used_at=self.now, displaced=False)
        self.etas.load_started[did] = self.now
        for v in victims:
            self.update(v.id, state="unloading", displaced=True)
        done = self.now
        for v in victims:
            done += timedelta(seconds=self.trace.unload_s)
            self.schedule(done, "unloaded", v.id)
        done += timedelta(seconds=self.model_of[did].load_s)
        self.load_number[did] = number = next(self.loads_started)
        self.schedule(done, "loaded", (did, (done - self.now).total_seconds(), number))
        return True

    def dispatch(self, rid: UUID, did: int) -> bool:
        r = self.waiting.get(rid)
        d = self.deployments[did]
        if r is None or r.state != "ready" or d.state != "loaded":
            return self.drop()
        del self.waiting[rid]
        used = {"last_used_at": self.now, "last_priority": r.priority}
        if r.priority == INTERACTIVE:
            used["last_interactive_at"] = self.now
        self.update(did, in_flight=d.in_flight + 1, **used)
        self.serving[rid] = did
        self.etas.sent(rid, did, r.priority, self.now)
        self.finish(r, "processing")
        spec = self.trace.requests[self.index[rid]]
        self.schedule(self.now + timedelta(seconds=spec.duration_s), "finished", rid)
        return True

    def finish(self, r: RequestView, state: str) -> None:
        waited = (self.now - r.created_at).total_seconds()
        self.result.outcomes[self.index[r.id]] = Outcome(r.priority, state, waited)


# -- the FIFO baseline -----------------------------------------------------------------------


@dataclass(slots=True)
class _Held:
    model: ModelSpec
    last_used: float


def simulate_fifo(trace: Workload) -> Result:
    """One queue, one worker, loads inline; the least recently used model goes first."""
    result = Result("FIFO", accepted=len(trace.requests))
    models = {m.name: m for m in trace.models}
    servers = {s.name: s for s in trace.servers}
    held: dict[str, list[_Held]] = defaultdict(list)
    free_at = 0.0
    for i, r in enumerate(trace.requests):
        max_wait = trace.max_wait_s[r.priority]
        start = max(free_at, r.at)
        if start - r.at >= max_wait:
            result.outcomes[i] = Outcome(r.priority, "expired", max_wait)
            continue
        model = models[r.model]
        where = next((s for s in model.servers if any(h.model is model for h in held[s])), None)
        if where is None:
            where, victims = _fifo_room(model, [servers[s] for s in model.servers], held)
            start += len(victims) * trace.unload_s + model.load_s
            held[where] = [h for h in held[where] if h not in victims] + [_Held(model, start)]
            result.loads += 1
        result.outcomes[i] = Outcome(r.priority, "completed", start - r.at)
        next(h for h in held[where] if h.model is model).last_used = start + r.duration_s
        free_at = start + r.duration_s
    return result


def _fifo_room(model: ModelSpec, candidates: list, held: dict[str, list[_Held]]):
    """The server needing the fewest evictions (then the oldest victims) and those victims."""
    options = []
    for server in candidates:
        kept = sorted(held[server.name], key=lambda h: h.last_used)
        victims: list[_Held] = []
        while True:
            same = [h for h in kept if h.model.type == model.type]
            used = sum(h.model.size_mb or 0 for h in kept) + (model.size_mb or 0)
            full = server.max_models is not None and len(kept) >= server.max_models
            if same and len(same) >= server.capacity.get(model.type, 1):
                victims.append(same[0])
            elif kept and (full or (server.memory_mb is not None and used > server.memory_mb)):
                victims.append(kept[0])
            else:
                break
            kept.remove(victims[-1])
        if server.memory_mb is None or (model.size_mb or 0) <= server.memory_mb:
            newest = max((v.last_used for v in victims), default=-1.0)
            options.append(((len(victims), newest), server.name, victims))
    if not options:
        raise ValueError(f"{model.name} fits on none of its servers")
    _, name, victims = min(options, key=lambda o: o[0])
    return name, victims

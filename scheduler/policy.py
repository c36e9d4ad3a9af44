"""The scheduling policy: `plan(snapshot, now) -> list[Decision]`. Pure.

Read `scheduler/README.md` first. One pass, in this order:

0. expire requests that waited past their limit; probe servers whose cooldown ended;
1. follow routed requests: a finished load makes its waiters ready; a deployment that went
   away, failed or sits on an unusable server sends them back to routing;
2. route pending requests, best first, in two rounds. First those that disturb nothing: to
   a server with the model loaded and a free slot, to one with it loaded, a short queue and
   no long line ahead, or to a load of it under way that few wait for. Then the rest, best
   first: a load where it is sent soon instead of a long line ahead; a parallel load beside
   a long queue or a long batch waiting for a load, else that queue or load; or a new load,
   where it is sent soon first, then with the least disruption.
   Routing the cheap ones first lets collation see every request for a loaded model;
3. dispatch ready requests into free slots, best first, on any server that has their
   model loaded (their own first);
4. housekeeping: unload models idle past their TTL, preload marked deployments, and on an
   idle server that can stop a load, restore what interactive work used lately;
5. for each server with every slot busy, what step 3 would send there as its slots free
   (`SendNext`), unless a request still waits to be placed for a model it holds; for each
   model loaded with a free slot, where steps 2 and 3 would send a request for it that
   arrives next, if no waiting request could use that server (`SendOnArrival`);
6. one `Defer` for the earliest moment something above changes by itself.

The pass is `_Pass`. This module holds its state and bookkeeping, `run`, and steps 0, 1 and
6. The other steps are mixins of `_Pass`, each in a module of its own, working on the pass's
state: step 2 in `routing.py` (`Routing`), with the loads it starts and what they may evict
in `switching.py` (`Switching`); steps 3 and 5 in `dispatching.py` (`Dispatching`); step 4
in `housekeeping.py` (`Housekeeping`). The priority classes are named in `priorities.py`.

"Best first" is (effective class, arrival, id), except that a request within `rescue_s` of
its expiry goes before all others, earliest expiry first. The effective class of a request
is its priority minus one for every `aging_step_s` it has waited; it keeps falling below 0
so that an interactive request that has waited a full step outranks fresh interactive ones.
"""

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from uuid import UUID

from . import fair_share
from . import reasons as waits
from .decisions import (
    Decision,
    Defer,
    Expire,
    Fail,
    MarkReady,
    Probe,
    Requeue,
)
from .dispatching import Dispatching
from .housekeeping import Housekeeping
from .routing import Routing
from .snapshot import DeploymentView, RequestView, Snapshot
from .switching import Switching

RESCUED = -(10**6)  # the line level of a request close to its expiry: before every class
Wakes = list[tuple[datetime, str]]


def plan(snapshot: Snapshot, now: datetime) -> list[Decision]:
    return _Pass(snapshot, now).run()


@dataclass(frozen=True)
class Plan:
    """A pass's decisions, and why each request it leaves waiting waits (`scheduler/reasons.py`)."""

    decisions: list[Decision]
    reasons: Mapping[UUID, waits.Reason]


def plan_explained(snapshot: Snapshot, now: datetime) -> Plan:
    """`plan`, with the reason of each request left waiting."""
    p = _Pass(snapshot, now)
    decisions = p.run()
    return Plan(decisions, waits.explain(p))


def effective_priority(request: RequestView, now: datetime, aging_step_s: float) -> int:
    """The request's class after aging: one class up per `aging_step_s` waited, unbounded."""
    waited_s = max((now - request.created_at).total_seconds(), 0.0)
    return request.priority - int(waited_s // aging_step_s)


class _Pass(Routing, Switching, Dispatching, Housekeeping):
    """One planning pass. Mutable bookkeeping lives here so decisions in the same pass see
    each other (a load started for one request is joined by the next). Steps 2 to 5 are
    its mixins' methods."""

    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.now = now
        self.config = snapshot.config
        self.servers = {s.id: s for s in snapshot.servers}
        self.deployments = {d.id: d for d in snapshot.deployments}
        # `candidates`, kept until a deployment changes: a deep line asks the same for each
        # of hundreds of requests of one model.
        self.found: dict[tuple[str, str | None], list[DeploymentView]] = {}
        # Models whose best waiting request found no load to start, as of which deployment
        # change, and the Fail it got if any (see `place`).
        self.deployment_changes = 0
        self.held_back: dict[str, tuple[int, Fail | None]] = {}
        self.unservable: dict[str, tuple[int, str | None]] = {}  # as of which change
        self.deployed = {d.model for d in snapshot.deployments}
        self.requests: dict[UUID, RequestView] = {}
        self.batches: dict[str, list[RequestView]] = {}
        self.batch_key: dict[str, tuple] = {}
        # Counts of routed requests, kept in step by `track`: a pass with thousands waiting
        # must not rescan them for every routing choice.
        self.waiters: dict[int, set[UUID]] = defaultdict(set)  # deployment → routed here
        self.routed: dict[int, int] = defaultdict(int)  # server → routed there
        self.ready_on_server: dict[int, int] = defaultdict(int)
        self.ready_on_deployment: dict[int, int] = defaultdict(int)
        self.order = [r.id for r in sorted(snapshot.requests, key=self.rank)]
        # (request, `soon_rank`) by `soon_rank`, made when first needed (`line_ahead`)
        self.soon_order: list[tuple[UUID, tuple]] | None = None
        self.no_leave: dict[str, int] = {}  # models that found no load to leave a line for
        self.shares = fair_share.Shares(snapshot.keys, snapshot.teams)
        self.quota = fair_share.Quota(self.shares)
        self.unseen = snapshot.unseen
        self.decisions: list[Decision] = []
        self.wake_times: Wakes = []
        # Why requests wait, as only the pass knows it (the rest is read off its end).
        self.notes: dict[UUID, waits.Reason] = {}
        self.held_heads: dict[str, UUID] = {}  # the request each `held_back` model's fared as
        # Busy deployments a better class's load waits for, run dry: no more work of a worse
        # class goes to them (`Switching.drain`, `Dispatching.free_slot_for`).
        self.drains: dict[int, int] = {}  # deployment → the best class waiting for it to go
        self.in_flight: dict[int, int] = defaultdict(int)
        for d in snapshot.deployments:
            self.in_flight[d.server_id] += d.in_flight
        for r in snapshot.requests:
            self.requests[r.id] = r
            self.track(r, +1)

    # -- helpers -------------------------------------------------------------------------

    def rank(self, r: RequestView) -> tuple:
        if self.rescued(r):  # earliest expiry first
            return (RESCUED, r.expires_at, r.id)
        return (self.effective(r), r.created_at, r.id)  # ids as the database orders them

    def rescued(self, r: RequestView) -> bool:
        """Within `rescue_s` of its expiry: it goes before every request that is not."""
        return r.expires_at - self.now <= timedelta(seconds=self.config.rescue_s)

    def level(self, r: RequestView) -> int:
        """The class a request is lined up in: its effective class, or first when rescued."""
        return RESCUED if self.rescued(r) else self.effective(r)

    def effective(self, r: RequestView) -> int:
        return effective_priority(r, self.now, self.config.aging_step_s)

    def ranked(self, state: str) -> list[RequestView]:
        """The requests now in `state`, best first."""
        found = (self.requests.get(rid) for rid in self.order)
        return [r for r in found if r is not None and r.state == state]

    def wake_at(self, at: datetime | None, reason: str, into: Wakes | None = None) -> None:
        if at is not None and at > self.now:
            (self.wake_times if into is None else into).append((at, reason))

    def note(self, r: RequestView, reason: waits.Reason) -> None:
        """Why `r` waits, as far as this rule knows (of two, the one that lifts first)."""
        self.notes[r.id] = waits.sooner(self.notes.get(r.id), reason)

    def on_server(self, server_id: int) -> list[DeploymentView]:
        return [d for d in self.deployments.values() if d.server_id == server_id]

    def load_under_way(self, server_id: int) -> bool:
        return any(d.state in ("loading", "unloading") for d in self.on_server(server_id))

    def usable(self, server_id: int) -> bool:
        server = self.servers.get(server_id)
        return server is not None and server.available(self.now) and server.health != "cooldown"

    def candidates(self, model: str, state: str | None = None) -> list[DeploymentView]:
        """The usable deployments of `model` (in `state`), as the pass has them now: enabled,
        on a usable server."""
        key = (model, state)
        if key not in self.found:
            self.found[key] = [
                d
                for d in self.deployments.values()
                if d.model == model
                and d.enabled
                and self.usable(d.server_id)
                and state in (None, d.state)
            ]
        return self.found[key]

    def least_busy(
        self, deployments: list[DeploymentView], warm: int | None = None
    ) -> DeploymentView | None:
        """The deployment on the least busy server; but the one on `warm` (where a request's
        conversation last ran: its prompt cache may still hold it) while that server has a
        free slot. Affinity never makes a request wait."""

        def order(d: DeploymentView) -> tuple:
            busy = self.busyness(d.server_id)
            return (not (d.server_id == warm and busy < 1), busy, d.id)

        return min(deployments, key=order, default=None)

    def busyness(self, server_id: int) -> float:
        busy = self.in_flight[server_id] + self.ready_on_server[server_id]
        return busy / max(self.servers[server_id].slots, 1)

    def track(self, r: RequestView, sign: int) -> None:
        d = self.deployments.get(r.deployment_id) if r.deployment_id is not None else None
        if d is None or r.state not in ("ready", "needs_loading"):
            return
        if sign > 0:
            self.waiters[d.id].add(r.id)
        else:
            self.waiters[d.id].discard(r.id)
        self.routed[d.server_id] += sign
        if r.state == "ready":
            self.ready_on_server[d.server_id] += sign
            self.ready_on_deployment[d.id] += sign

    def drop(self, r: RequestView) -> None:
        self.track(r, -1)
        del self.requests[r.id]

    def waiting_on(self, deployment_id: int) -> list[RequestView]:
        return [self.requests[rid] for rid in self.waiters[deployment_id]]

    def set_deployment(self, deployment: DeploymentView, **changes) -> None:
        self.deployments[deployment.id] = replace(deployment, **changes)
        self.found.clear()
        self.deployment_changes += 1

    def set_state(self, deployment: DeploymentView, state: str) -> None:
        self.set_deployment(deployment, state=state)

    def set_request(self, request: RequestView, **changes) -> RequestView:
        updated = replace(request, **changes)
        self.track(request, -1)
        self.requests[request.id] = updated
        self.track(updated, +1)
        return updated

    # -- the pass ------------------------------------------------------------------------

    def run(self) -> list[Decision]:
        self.expire_and_probe()
        self.follow_routed()
        self.route_pending()
        self.dispatch()
        self.housekeeping()
        self.send_next()
        self.send_on_arrival()
        if self.wake_times:
            at, reason = min(self.wake_times, key=lambda t: t[0])
            self.decisions.append(Defer(at, reason))
        return self.decisions

    def expire_and_probe(self) -> None:
        for r in list(self.requests.values()):
            if r.expires_at <= self.now:
                waited = (self.now - r.created_at).total_seconds()
                self.decisions.append(Expire(r.id, f"still waiting after {waited:.0f} s"))
                self.drop(r)
            else:
                self.wake_at(r.expires_at, "a request expires")
        for s in self.servers.values():
            if not s.enabled or s.health != "cooldown":
                continue
            if s.cooldown_until is None or s.cooldown_until <= self.now:
                self.decisions.append(Probe(s.id))
            else:
                self.wake_at(s.cooldown_until, f"{s.name} cooldown ends")

    def follow_routed(self) -> None:
        for r in list(self.requests.values()):
            if r.state == "pending":
                continue
            # None once its deployment was deleted (the row's link is cleared).
            d = self.deployments.get(r.deployment_id)
            if d is None:
                self.requeue(r, "its deployment was removed")
            elif not self.usable(d.server_id):
                self.requeue(r, f"server {self.servers[d.server_id].name} is unavailable")
            elif not d.enabled:
                self.requeue(r, f"{d.model} was disabled on {self.servers[d.server_id].name}")
            elif r.state == "needs_loading" and d.state == "loaded":
                self.decisions.append(MarkReady(r.id, d.id))
                self.set_request(r, state="ready")
            elif r.state == "needs_loading" and d.state == "loading":
                continue
            elif r.state == "needs_loading" and d.last_error:
                self.requeue(r, f"loading {d.model} failed: {d.last_error}")
            elif d.state != "loaded":
                self.requeue(r, f"{d.model} is {d.state} on its server")

    def requeue(self, r: RequestView, reason: str) -> None:
        self.decisions.append(Requeue(r.id, reason, r.deployment_id))
        self.set_request(r, state="pending", deployment_id=None)

    def fail(self, r: RequestView, code: str, message: str) -> None:
        self.decisions.append(Fail(r.id, code, message))
        self.drop(r)

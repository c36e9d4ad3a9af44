"""The scheduling policy: `plan(snapshot, now) -> list[Decision]`. Pure.

Read `scheduler/README.md` first. One pass, in this order:

0. expire requests that waited past their class's limit; probe servers whose cooldown ended;
1. follow routed requests: a finished load makes its waiters ready; a deployment that went
   away sends them back to routing;
2. route pending requests, best first: a server with the model loaded (least busy first),
   else join a load under way, else start a load with the least disruption;
3. dispatch ready requests into free slots, best first;
4. housekeeping: unload models idle past their TTL, preload marked deployments;
5. one `Defer` for the earliest moment something above changes by itself.

"Best first" is (effective priority, arrival, id); the effective priority of a request moves
up one class for every `aging_step_s` it has waited, so nothing starves.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta

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
    StartLoad,
    Unload,
)
from .eviction import NoRoom, evictions_for, keep_value
from .snapshot import DeploymentView, RequestView, ServerView, Snapshot

INTERACTIVE, HIGH, NORMAL, BACKGROUND = 0, 1, 2, 3
PERMANENT_LOAD_ERRORS = ("not_found", "model_too_large", "no_room")


def plan(snapshot: Snapshot, now: datetime) -> list[Decision]:
    return _Pass(snapshot, now).run()


def effective_priority(request: RequestView, now: datetime, aging_step_s: float) -> int:
    waited_s = max((now - request.created_at).total_seconds(), 0.0)
    return max(INTERACTIVE, request.priority - int(waited_s // aging_step_s))


class _Pass:
    """One planning pass. Mutable bookkeeping lives here so decisions in the same pass see
    each other (a load started for one request is joined by the next)."""

    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.now = now
        self.config = snapshot.config
        self.servers = {s.id: s for s in snapshot.servers}
        self.deployments = {d.id: d for d in snapshot.deployments}
        self.requests = sorted(snapshot.requests, key=self.rank)
        self.decisions: list[Decision] = []
        self.wake_times: list[tuple[datetime, str]] = []
        self.in_flight: dict[int, int] = defaultdict(int)
        for d in snapshot.deployments:
            self.in_flight[d.server_id] += d.in_flight

    # -- helpers -------------------------------------------------------------------------

    def rank(self, r: RequestView) -> tuple:
        return (self.effective(r), r.created_at, str(r.id))

    def effective(self, r: RequestView) -> int:
        return effective_priority(r, self.now, self.config.aging_step_s)

    def wake_at(self, at: datetime | None, reason: str) -> None:
        if at is not None and at > self.now:
            self.wake_times.append((at, reason))

    def on_server(self, server_id: int) -> list[DeploymentView]:
        return [d for d in self.deployments.values() if d.server_id == server_id]

    def load_under_way(self, server_id: int) -> bool:
        return any(d.state in ("loading", "unloading") for d in self.on_server(server_id))

    def usable(self, server_id: int) -> bool:
        server = self.servers.get(server_id)
        return server is not None and server.available(self.now) and server.health != "cooldown"

    def waiting_on(self, deployment_id: int) -> list[RequestView]:
        return [
            r
            for r in self.requests
            if r.deployment_id == deployment_id and r.state in ("ready", "needs_loading")
        ]

    def set_state(self, deployment: DeploymentView, state: str) -> None:
        self.deployments[deployment.id] = replace(deployment, state=state)

    def set_request(self, request: RequestView, **changes) -> RequestView:
        updated = replace(request, **changes)
        self.requests[self.requests.index(request)] = updated
        return updated

    # -- the pass ------------------------------------------------------------------------

    def run(self) -> list[Decision]:
        self.expire_and_probe()
        self.follow_routed()
        for request in [r for r in self.requests if r.state == "pending"]:
            self.route(request)
        self.dispatch()
        self.housekeeping()
        if self.wake_times:
            at, reason = min(self.wake_times, key=lambda t: t[0])
            self.decisions.append(Defer(at, reason))
        return self.decisions

    def expire_and_probe(self) -> None:
        for r in list(self.requests):
            if r.expires_at <= self.now:
                waited = (self.now - r.created_at).total_seconds()
                self.decisions.append(Expire(r.id, f"still waiting after {waited:.0f} s"))
                self.requests.remove(r)
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
        for r in list(self.requests):
            if r.state == "pending" or r.deployment_id is None:
                continue
            d = self.deployments.get(r.deployment_id)
            if d is None:
                self.requeue(r, "its deployment was removed")
            elif d.state == "failed" and r.state == "needs_loading":
                if d.last_error_code in PERMANENT_LOAD_ERRORS:
                    self.fail(r, d.last_error_code, d.last_error or "the model failed to load")
                else:
                    self.requeue(r, f"load failed: {d.last_error or 'unknown error'}")
            elif not self.usable(d.server_id):
                self.requeue(r, f"server {self.servers[d.server_id].name} is unavailable")
            elif r.state == "needs_loading" and d.state == "loaded":
                self.decisions.append(MarkReady(r.id))
                self.set_request(r, state="ready")
            elif r.state == "needs_loading" and d.state == "loading":
                continue
            elif d.state != "loaded":
                self.requeue(r, f"{d.model} is {d.state} on its server")

    def requeue(self, r: RequestView, reason: str) -> None:
        self.decisions.append(Requeue(r.id, reason))
        self.set_request(r, state="pending", deployment_id=None)

    def fail(self, r: RequestView, code: str, message: str) -> None:
        self.decisions.append(Fail(r.id, code, message))
        self.requests.remove(r)

    # -- routing -------------------------------------------------------------------------

    def route(self, r: RequestView) -> None:
        deployments = [d for d in self.deployments.values() if d.model == r.model]
        if not deployments:
            self.fail(r, "model_not_deployed", f"no server has a deployment of {r.model}")
            return
        candidates = [d for d in deployments if self.usable(d.server_id)]

        loaded = [d for d in candidates if d.state == "loaded"]
        if loaded:
            best = min(loaded, key=lambda d: (self.busyness(d.server_id), d.id))
            self.route_to(r, best, ready=True, reason="model loaded there")
            return
        loading = [d for d in candidates if d.state == "loading"]
        if loading:
            best = min(loading, key=lambda d: (self.busyness(d.server_id), d.id))
            self.route_to(r, best, ready=False, reason="joins the load under way")
            return
        self.route_to_new_load(r, candidates, deployments)

    def busyness(self, server_id: int) -> float:
        queued = sum(
            1
            for r in self.requests
            if r.state == "ready" and self.deployments[r.deployment_id].server_id == server_id
        )
        return (self.in_flight[server_id] + queued) / max(self.servers[server_id].slots, 1)

    def route_to(self, r: RequestView, d: DeploymentView, ready: bool, reason: str) -> None:
        server = self.servers[d.server_id].name
        self.decisions.append(Route(r.id, d.id, ready, f"{reason} ({server})"))
        self.set_request(r, state="ready" if ready else "needs_loading", deployment_id=d.id)

    def route_to_new_load(
        self, r: RequestView, candidates: list[DeploymentView], all_of_model: list
    ) -> None:
        options: list[tuple[tuple, DeploymentView, tuple[int, ...]]] = []
        reasons: list[NoRoom] = []
        for d in candidates:
            if d.state == "failed":
                reasons.append(NoRoom(d.last_error, d.last_error_code in PERMANENT_LOAD_ERRORS))
                continue
            if d.next_load_at and d.next_load_at > self.now:
                self.wake_at(d.next_load_at, f"retry loading {d.model}")
                reasons.append(NoRoom("waiting to retry the load"))
                continue
            if self.load_under_way(d.server_id):
                reasons.append(NoRoom("another load is under way there"))
                continue
            outcome = self.room_for(d, r)
            if isinstance(outcome, NoRoom):
                reasons.append(outcome)
                continue
            cost = sum(
                keep_value(self.deployments[e], self.now, self.config.default_load_s)
                for e in outcome
            )
            waiting_there = sum(
                1
                for w in self.requests
                if w.deployment_id and self.deployments[w.deployment_id].server_id == d.server_id
            )
            options.append(((len(outcome) > 0, cost, waiting_there, d.id), d, outcome))

        if options:
            _, d, evict = min(options, key=lambda o: o[0])
            self.start_load(d, evict, f"{r.model} requested")
            self.route_to(r, d, ready=False, reason="load started")
            return
        unreachable = len(candidates) < len(all_of_model)
        if reasons and all(n.permanent for n in reasons) and not unreachable:
            self.fail(r, "model_unavailable", "; ".join(n.reason for n in reasons))

    def start_load(self, d: DeploymentView, evict: Iterable[int], reason: str) -> None:
        evict = tuple(evict)
        self.decisions.append(StartLoad(d.id, evict, reason))
        self.set_state(d, "loading")
        for e in evict:
            self.set_state(self.deployments[e], "unloading")

    def room_for(self, d: DeploymentView, r: RequestView) -> tuple[int, ...] | NoRoom:
        server = self.servers[d.server_id]
        resident = self.on_server(d.server_id)
        if d.load_failures and d.last_error_code not in PERMANENT_LOAD_ERRORS:
            # After a failed load, clear the whole server and try once more.
            outcome = evictions_for(d, server, resident, self.now, lambda _: True)
            if isinstance(outcome, NoRoom):
                return outcome
            idle = [
                x.id
                for x in resident
                if x.id != d.id and x.state == "loaded" and x.in_flight == 0 and not x.pinned
            ]
            return tuple(sorted(set(outcome) | set(idle)))
        return evictions_for(
            d,
            server,
            resident,
            self.now,
            lambda victim: self.may_evict(victim, r, server),
            self.config.default_load_s,
        )

    def may_evict(self, victim: DeploymentView, r: RequestView, server: ServerView) -> bool:
        """The anti-thrash rules: collation, minimum residency, affinity guards."""
        mine = self.effective(r)
        theirs = [self.effective(w) for w in self.waiting_on(victim.id)]
        # Collation: finish the loaded model's queue unless this request outranks all of it.
        if theirs and mine >= min(theirs):
            return False
        resident_until = (
            victim.loaded_at + timedelta(seconds=self.config.min_residency_s)
            if victim.loaded_at
            else None
        )
        if resident_until and resident_until > self.now:
            users = theirs or ([victim.last_priority] if victim.last_priority is not None else [])
            if users and mine >= min(users):
                self.wake_at(resident_until, f"{victim.model} minimum residency ends")
                return False
        if mine >= NORMAL and victim.last_interactive_at:
            warm_until = victim.last_interactive_at + timedelta(seconds=self.config.warm_window_s)
            if warm_until > self.now:
                self.wake_at(warm_until, f"{victim.model} warm window ends")
                return False
        if mine >= BACKGROUND:
            last = max(
                (d.last_interactive_at for d in self.on_server(server.id) if d.last_interactive_at),
                default=None,
            )
            if last:
                active_until = last + timedelta(seconds=self.config.activity_window_s)
                if active_until > self.now:
                    self.wake_at(active_until, f"interactive activity on {server.name}")
                    return False
        return True

    # -- dispatch ------------------------------------------------------------------------

    def dispatch(self) -> None:
        for r in [r for r in self.requests if r.state == "ready"]:
            d = self.deployments[r.deployment_id]
            if d.state != "loaded":
                continue
            if self.in_flight[d.server_id] >= self.servers[d.server_id].slots:
                continue
            if r.not_before and r.not_before > self.now:
                self.wake_at(r.not_before, "retry a request")
                continue
            self.decisions.append(Dispatch(r.id, d.id))
            self.in_flight[d.server_id] += 1
            self.deployments[d.id] = replace(d, in_flight=d.in_flight + 1)
            self.requests.remove(r)

    # -- housekeeping --------------------------------------------------------------------

    def housekeeping(self) -> None:
        for d in list(self.deployments.values()):
            if not self.usable(d.server_id):
                continue
            if d.state == "loaded" and d.idle_ttl_s is not None and not d.pinned:
                self.unload_if_idle(d)
            elif d.preload and d.state == "unloaded" and not self.load_under_way(d.server_id):
                if d.next_load_at and d.next_load_at > self.now:
                    self.wake_at(d.next_load_at, f"retry preloading {d.model}")
                    continue
                outcome = evictions_for(
                    d,
                    self.servers[d.server_id],
                    self.on_server(d.server_id),
                    self.now,
                    lambda _: False,
                )
                if outcome == ():
                    self.start_load(d, (), "preload")

    def unload_if_idle(self, d: DeploymentView) -> None:
        if d.in_flight or self.waiting_on(d.id) or self.load_under_way(d.server_id):
            return
        if any(r.state == "pending" and r.model == d.model for r in self.requests):
            return
        last = d.last_used_at or d.loaded_at or self.now
        idle_until = last + timedelta(seconds=d.idle_ttl_s)
        if idle_until <= self.now:
            self.decisions.append(Unload(d.id, f"idle for {d.idle_ttl_s:.0f} s"))
            self.set_state(d, "unloading")
        else:
            self.wake_at(idle_until, f"{d.model} idle TTL")

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
4. housekeeping: unload models idle past their TTL, preload marked deployments;
5. for each server with every slot busy, what step 3 would send there as its slots free
   (`SendNext`), unless a request still waits to be placed for a model it holds; for each
   model loaded with a free slot, where steps 2 and 3 would send a request for it that
   arrives next, if no waiting request could use that server (`SendOnArrival`);
6. one `Defer` for the earliest moment something above changes by itself.

"Best first" is (effective class, arrival, id), except that a request within `rescue_s` of
its expiry goes before all others, earliest expiry first. The effective class of a request
is its priority minus one for every `aging_step_s` it has waited; it keeps falling below 0
so that an interactive request that has waited a full step outranks fresh interactive ones.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from uuid import UUID

from . import fair_share, holding
from . import reasons as waits
from .decisions import (
    Decision,
    Defer,
    Dispatch,
    Expire,
    Fail,
    MarkReady,
    Probe,
    Requeue,
    SendNext,
    SendOnArrival,
    StartLoad,
    Unload,
)
from .eviction import NoRoom, evictions_for, keep_value
from .routing import Routing
from .snapshot import DeploymentView, RequestView, Snapshot

INTERACTIVE, HIGH, NORMAL, BACKGROUND = 0, 1, 2, 3
CLASS_NAMES = {INTERACTIVE: "interactive", HIGH: "high", NORMAL: "normal", BACKGROUND: "background"}
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


class _Pass(Routing):
    """One planning pass. Mutable bookkeeping lives here so decisions in the same pass see
    each other (a load started for one request is joined by the next)."""

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
        self.keys = {k.id: k for k in snapshot.keys}
        self.quota = fair_share.Quota(self.keys)
        self.unseen = snapshot.unseen
        self.decisions: list[Decision] = []
        self.wake_times: Wakes = []
        # Why requests wait, as only the pass knows it (the rest is read off its end).
        self.notes: dict[UUID, waits.Reason] = {}
        self.held_heads: dict[str, UUID] = {}  # the request each `held_back` model's fared as
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
        """The usable deployments of `model` (in `state`), as the pass has them now."""
        key = (model, state)
        if key not in self.found:
            self.found[key] = [
                d
                for d in self.deployments.values()
                if d.model == model and self.usable(d.server_id) and state in (None, d.state)
            ]
        return self.found[key]

    def least_busy(self, deployments: list[DeploymentView]) -> DeploymentView | None:
        return min(deployments, key=lambda d: (self.busyness(d.server_id), d.id), default=None)

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
            if r.state == "pending" or r.deployment_id is None:
                continue
            d = self.deployments.get(r.deployment_id)
            if d is None:
                self.requeue(r, "its deployment was removed")
            elif not self.usable(d.server_id):
                self.requeue(r, f"server {self.servers[d.server_id].name} is unavailable")
            elif r.state == "needs_loading" and d.state == "loaded":
                self.decisions.append(MarkReady(r.id))
                self.set_request(r, state="ready")
            elif r.state == "needs_loading" and d.state == "loading":
                continue
            elif r.state == "needs_loading" and d.last_error:
                self.requeue(r, f"loading {d.model} failed: {d.last_error}")
            elif d.state != "loaded":
                self.requeue(r, f"{d.model} is {d.state} on its server")

    def requeue(self, r: RequestView, reason: str) -> None:
        self.decisions.append(Requeue(r.id, reason))
        self.set_request(r, state="pending", deployment_id=None)

    def fail(self, r: RequestView, code: str, message: str) -> None:
        self.decisions.append(Fail(r.id, code, message))
        self.drop(r)

    def start_new_load(
        self, r: RequestView, free_only: bool = False, leave: DeploymentView | None = None
    ) -> bool:
        """Start a load for `r` with the least disruption: where it is then sent soon first,
        then free room, then the fewest evictions, then the cheapest, then the server with
        the fewest waiting requests. Fails `r` when no server ever could; otherwise it waits
        (with a `Defer` when a rule lifts at a known time). With `leave` (its model loaded
        behind a long line there), only where `r` is sent soon, evicting only what its wait
        there is worth (`may_evict_to_leave`)."""
        wakes: Wakes = []
        options: list[tuple[tuple, DeploymentView, tuple[int, ...]]] = []
        reasons: list[NoRoom] = []
        candidates = self.candidates(r.model)
        leave_wait_s = None if leave is None else self.wait_in_line_s(r, leave)
        for d in candidates:
            if d.state == "failed":
                message = d.last_error or f"{d.model} failed to load"
                reasons.append(NoRoom(message, True, d.last_error_code or "load_failed"))
            elif d.state != "unloaded":
                reasons.append(
                    NoRoom(f"{d.model} is {d.state} on {self.servers[d.server_id].name}")
                )
            elif d.next_load_at and d.next_load_at > self.now:
                self.wake_at(d.next_load_at, f"retry loading {d.model}", wakes)
                reasons.append(NoRoom(f"its load on {self.servers[d.server_id].name} is retried"))
            elif self.load_under_way(d.server_id):
                reasons.append(
                    NoRoom(f"another load is under way on {self.servers[d.server_id].name}")
                )
            elif leave is not None and not self.sent_soon(r, d.server_id):
                continue
            else:
                outcome = self.room_for(d, r, wakes, free_only, leave_wait_s)
                if isinstance(outcome, NoRoom):
                    reasons.append(outcome)
                    continue
                cost = sum(self.victim_cost(self.deployments[e]) for e in outcome)
                waiting = self.routed[d.server_id]
                spare = self.spare_after(d, outcome)
                options.append(((len(outcome), cost, waiting, spare, d.id), d, outcome))

        if len(options) > 1:  # where it is sent soon first (the line is counted only then)
            options = [((not self.sent_soon(r, d.server_id), *k), d, e) for k, d, e in options]
        if options:
            _, d, evict = min(options, key=lambda o: o[0])
            why = "a parallel load beside a long queue" if free_only else f"{r.model} requested"
            if leave is not None:
                there = self.servers[leave.server_id].name
                why = f"{r.model} requested, behind a long line on {there}"
            self.start_load(d, evict, why, for_request=r)
            self.route_to(r, d, ready=False, reason="load started")
            return True
        if free_only or leave is not None:
            return False
        self.wake_times.extend(wakes)
        if r.id not in self.notes:
            until = min((at for at, _ in wakes), default=None)
            self.notes[r.id] = waits.no_room(r.model, (n.reason for n in reasons), until)
        all_reachable = len(candidates) == sum(
            1 for d in self.deployments.values() if d.model == r.model
        )
        if reasons and all(n.permanent for n in reasons) and all_reachable:
            codes = {n.code for n in reasons}
            code = codes.pop() if len(codes) == 1 else "model_unavailable"
            self.fail(r, code, "; ".join(dict.fromkeys(n.reason for n in reasons)))
        return False

    def victim_cost(self, victim: DeploymentView) -> float:
        """`keep_value` weighted by the class of the victim's interactive or last user: an
        idle model interactive work uses is dearer to evict than one background work used."""
        recent = (
            victim.last_interactive_at is not None
            and victim.last_interactive_at + timedelta(seconds=self.config.activity_window_s)
            > self.now
        )
        users = INTERACTIVE if recent else victim.last_priority
        weight = holding.class_weight(users if users is not None else BACKGROUND)
        return weight * keep_value(victim, self.now, self.config.default_load_s)

    def spare_after(self, d: DeploymentView, evict: tuple[int, ...]) -> float:
        """Memory left on the server once `d` is in (best fit keeps big servers for big
        models); without a budget, every server counts as equally full."""
        server = self.servers[d.server_id]
        if server.memory_mb is None:
            return 0.0
        used = sum(
            x.size_mb or 0
            for x in self.on_server(d.server_id)
            if x.occupies_room and x.id not in evict and x.id != d.id
        )
        return server.memory_mb - used - (d.size_mb or 0)

    def start_load(
        self,
        d: DeploymentView,
        evict: Iterable[int],
        reason: str,
        for_request: RequestView | None = None,
    ) -> None:
        evict = tuple(evict)
        self.decisions.append(StartLoad(d.id, evict, reason))
        self.set_state(d, "loading")
        for e in evict:
            self.set_state(self.deployments[e], "unloading")
            # Its waiters go back to routing now, told it was our own eviction.
            server = self.servers[d.server_id].name
            cls = CLASS_NAMES.get(for_request.priority, "") if for_request else ""
            for w in self.waiting_on(e):
                self.requeue(w, f"evicted from {server} for {d.model} ({cls})")

    def room_for(
        self,
        d: DeploymentView,
        r: RequestView,
        wakes: Wakes,
        free_only: bool,
        leave_wait_s: float | None = None,
    ) -> tuple[int, ...] | NoRoom:
        server = self.servers[d.server_id]
        resident = self.on_server(d.server_id)
        if leave_wait_s is not None:
            return evictions_for(
                d,
                server,
                resident,
                self.now,
                lambda victim: self.may_evict_to_leave(victim, r, d, leave_wait_s),
                self.config.default_load_s,
            )
        if free_only:
            # A parallel load evicts only what the queue it drains is worth more than.
            busy = self.least_busy(self.candidates(r.model, "loaded")) or self.least_busy(
                self.candidates(r.model, "loading")
            )
            queue = self.waiting_on(busy.id) if busy is not None else []
            run_s = busy.avg_inference_s if busy is not None else None
            return evictions_for(
                d,
                server,
                resident,
                self.now,
                lambda victim: self.may_evict_for_queue(victim, queue, d, run_s),
                self.config.default_load_s,
            )
        if d.load_failures and d.last_error_code != "not_found":
            # The last load failed (often out of memory): clear the server and try again.
            outcome = evictions_for(d, server, resident, self.now, lambda _: True)
            if isinstance(outcome, NoRoom):
                return outcome
            idle = {
                x.id
                for x in resident
                if x.id != d.id and x.state == "loaded" and x.in_flight == 0 and not x.pinned
            }
            return tuple(sorted(set(outcome) | idle))
        return evictions_for(
            d,
            server,
            resident,
            self.now,
            lambda victim: self.may_evict(victim, r, d, wakes),
            self.config.default_load_s,
        )

    def may_evict(
        self, victim: DeploymentView, r: RequestView, target: DeploymentView, wakes: Wakes
    ) -> bool:
        """May `r`'s load of `target` evict the idle `victim`? The rules, in order: no wasted
        load, a request about to expire, priced collation, minimum residency, the priced hold
        (see `holding.py`)."""
        server = self.servers[target.server_id]
        mine = self.effective(r)
        theirs = self.waiting_on(victim.id)
        # No wasted load: the requests that waited for the victim's load go first.
        if victim.loaded_at and any(w.created_at <= victim.loaded_at for w in theirs):
            self.note(r, waits.held("no_wasted_load", server.name, victim.model, None))
            return False
        # About to expire: the holds below would only make it expire (see `urgent`).
        if self.urgent(r, target) and holding.rescue_pays(
            mine,
            (r.expires_at - r.created_at).total_seconds(),
            [self.effective(w) for w in theirs if not self.rescued(w)],
            any(self.rescued(w) for w in theirs),
            self.load_s(victim),
        ):
            return True
        batch = self.batch_of(r.model)
        if theirs and not holding.outranks(
            [self.effective(b) for b in batch],
            [self.effective(w) for w in theirs],
            self.load_s(target),
            self.load_s(victim),
            server.slots,
            self.config,
        ):
            self.note(r, waits.held("collation", server.name, victim.model, None))
            return False
        if victim.loaded_at:
            resident_until = self.resident_until(victim)
            users = [self.effective(w) for w in theirs] or (
                [victim.last_priority] if victim.last_priority is not None else []
            )
            if resident_until > self.now and users and mine >= min(users):
                self.wake_at(resident_until, f"{victim.model} minimum residency ends", wakes)
                self.note(r, waits.held("residency", server.name, victim.model, resident_until))
                return False
        protected, protected_until = self.protection(victim, server.id, mine)
        if mine >= BACKGROUND and len(batch) > server.slots + self.config.parallel_load_queue:
            # A background batch that fills the server and queues behind it needs the switch
            # however long it is held: holding only delays it (the 14:00 flood, 35 s).
            protected, protected_until = 0.0, None
        free_slot = self.in_flight[server.id] < server.slots
        # Batching is for normal and background switches: a better class is not held to
        # share a switch with requests that may never come.
        batching = not free_slot and mine >= NORMAL and self.has_choice(r.model)
        save = holding.hold_saving(
            self.load_s(victim), protected, self.load_s(target) if batching else 0.0, mine
        )
        release = holding.release_at(
            save,
            [(self.effective(b), b.created_at) for b in batch],
            self.now,
            None if batching else protected_until,
        )
        if release is None:
            return True
        self.wake_at(release, f"held: switch on {server.name} for {r.model}", wakes)
        rule, saves = ("batching", self.load_s(target)) if batching else ("protected", None)
        self.note(r, waits.held(rule, server.name, victim.model, release, saves))
        return False

    def urgent(self, r: RequestView, target: DeploymentView) -> bool:
        """`r` is served before it expires only if its load of `target` starts within
        `urgent_load_s`, and can still be if it starts now."""
        left = (r.expires_at - self.now).total_seconds() - self.load_s(target)
        return 0 <= left <= self.config.urgent_load_s

    def may_evict_for_queue(
        self,
        victim: DeploymentView,
        queue: list[RequestView],
        target: DeploymentView,
        run_s: float | None = None,
    ) -> bool:
        """A parallel load beside a long queue: it may evict an idle model nobody waits for
        and past its minimum residency, when draining the queue on two servers saves more
        than the victim's reload costs its expected users (`holding.parallel_pays`, the
        queue priced at its model's measured run time `run_s`)."""
        if not queue:
            return False
        best = min(self.effective(q) for q in queue)
        users = self.idle_victim_users(victim, target.server_id, best)
        return users is not None and holding.parallel_pays(
            [self.effective(q) for q in queue],
            self.load_s(target),
            self.load_s(victim),
            users,
            self.config,
            run_s,
        )

    def may_evict_to_leave(
        self, victim: DeploymentView, r: RequestView, target: DeploymentView, wait_s: float
    ) -> bool:
        """A load for a request behind a long line elsewhere may evict an idle model nobody
        waits for, past its minimum residency, when the wait it saves outweighs the victim's
        reload for its expected users (`holding.leave_pays`)."""
        mine = self.effective(r)
        users = self.idle_victim_users(victim, target.server_id, mine)
        return users is not None and holding.leave_pays(
            mine, wait_s, self.load_s(target), self.load_s(victim), users
        )

    def idle_victim_users(self, victim: DeploymentView, server_id: int, mine: int) -> float | None:
        """The weight of an idle `victim`'s expected users (the protected work a switch by
        class `mine` would make wait, or its last user's class), as the loads that only
        drain work elsewhere price it; None if they may not evict it at all: someone waits
        for it, or it is within its minimum residency."""
        if self.waiting_on(victim.id):
            return None
        if victim.loaded_at and self.resident_until(victim) > self.now:
            return None
        protected, _ = self.protection(victim, server_id, mine)
        last = victim.last_priority
        return max(protected, holding.class_weight(last) if last is not None else 0.0)

    def batch_of(self, model: str) -> list[RequestView]:
        """The requests not yet placed that one load of `model` would serve."""
        key = (model, self.deployment_changes, len(self.decisions))
        if self.batch_key.get(model) != key:
            self.batches[model] = [
                q for q in self.requests.values() if q.state == "pending" and q.model == model
            ]
            self.batch_key[model] = key
        return self.batches[model]

    def load_s(self, d: DeploymentView) -> float:
        return d.avg_load_s or self.config.default_load_s

    def resident_until(self, d: DeploymentView) -> datetime:
        """A loaded model stays at least as long as loading it back takes, up to
        `min_residency_s` (ski rental: holding a switch longer than the victim's reload makes
        the waiting request pay more than the thrash it prevents could cost the victim's
        next user). A model that loads in 0.3 s is not held for 30 s."""
        assert d.loaded_at is not None
        return d.loaded_at + timedelta(seconds=min(self.config.min_residency_s, self.load_s(d)))

    def protection(
        self, victim: DeploymentView, server_id: int, mine: int
    ) -> tuple[float, datetime | None]:
        """The protected work a switch evicting `victim` is expected to make wait."""
        last_on_server = max(
            (d.last_interactive_at for d in self.on_server(server_id) if d.last_interactive_at),
            default=None,
        )
        return holding.protected_weight(
            mine, victim.last_interactive_at, last_on_server, self.now, self.config
        )

    def has_choice(self, model: str) -> bool:
        """More than one usable server could hold `model`."""
        return sum(1 for d in self.candidates(model) if d.state != "failed") > 1

    # -- dispatch ------------------------------------------------------------------------

    def fairly(self, ranked: list[RequestView]) -> list[RequestView]:
        """Within each class, API keys share the slots by weight (see fair_share)."""
        return fair_share.fair_order(ranked, self.level, self.keys)

    def dispatch(self) -> None:
        for r in self.fairly(self.ranked("ready")):
            if not self.any_free_slot():
                # The rest waits; a slot that frees wakes the loop (retries' times included).
                return
            if self.backing_off(r):
                self.wake_at(r.not_before, "retry a request")
                continue
            if not self.quota.allows(r):  # its key's quota is full: one of its own ends first
                continue
            d = self.free_slot_for(r)
            if d is None:
                continue
            self.quota.take(r)
            self.decisions.append(Dispatch(r.id, d.id))
            self.in_flight[d.server_id] += 1
            self.set_deployment(d, in_flight=d.in_flight + 1)
            self.drop(r)

    def backing_off(self, r: RequestView) -> bool:
        """A retry that must not be sent before its `not_before`."""
        return r.not_before is not None and r.not_before > self.now

    def any_free_slot(self) -> bool:
        return any(self.in_flight[s.id] < s.slots for s in self.servers.values())

    def free_slot_for(self, r: RequestView) -> DeploymentView | None:
        """Its own deployment if it has a free slot, else another server with its model
        loaded and a free slot: a queue on a busy server drains onto an idle one."""
        own = self.deployments[r.deployment_id]
        others = sorted(self.candidates(r.model, "loaded"), key=lambda d: d.id)
        for d in [own, *others]:
            if (
                d.state == "loaded"
                and self.in_flight[d.server_id] < self.servers[d.server_id].slots
            ):
                return d
        return None

    def send_next(self) -> None:
        """For each usable server whose slots are all busy: the ready requests that
        `dispatch` would send there as its slots free, best first, one per slot. None where
        a request still waits to be placed for a model the server holds: an idle slot may be
        what it waits for (a load that evicts)."""
        full = [
            s
            for s in self.servers.values()
            if self.in_flight[s.id] >= s.slots and self.usable(s.id)
        ]
        if not full:  # most passes of a quiet system: no need to rank the line again
            return
        unplaced = {r.model for r in self.requests.values() if r.state == "pending"}
        ready = [r for r in self.fairly(self.ranked("ready")) if not self.backing_off(r)]
        if not ready:
            return
        quota = self.quota.copy()  # a request sent next takes a slot of its key's quota
        for s in full:
            here = sorted(self.on_server(s.id), key=lambda d: d.id)
            if any(d.model in unplaced for d in here):
                continue
            loaded: dict[str, DeploymentView] = {}
            for d in here:
                if d.state == "loaded":
                    loaded.setdefault(d.model, d)
            nexts = 0
            for r in ready:
                own = self.deployments.get(r.deployment_id) if r.deployment_id else None
                d = own if own is not None and own.server_id == s.id else loaded.get(r.model)
                if d is None or d.state != "loaded" or not quota.allows(r):
                    continue
                quota.take(r)
                self.decisions.append(
                    SendNext(s.id, r.id, d.id, r.expires_at, self.effective(r), r.api_key)
                )
                nexts += 1
                if nexts == s.slots:
                    break

    def send_on_arrival(self) -> None:
        """For each model loaded with a free slot, the deployment a request for it that
        arrives next would be routed to (the least busy one with the model loaded: step 2)
        and sent to at once (step 3), if no request left waiting could use its server: none
        waits for a model deployed there (to be sent, or loaded, evicting)."""
        wanted = {r.model for r in self.requests.values()} | self.unseen
        claimed = {d.server_id for d in self.deployments.values() if d.model in wanted}
        for model in sorted(self.deployed):
            d = self.least_busy(self.candidates(model, "loaded"))
            if d is None or d.server_id in claimed:
                continue
            room = self.servers[d.server_id].slots - self.in_flight[d.server_id]
            if room > 0:
                self.decisions.append(SendOnArrival(model, d.id, d.server_id, room))

    # -- housekeeping --------------------------------------------------------------------

    def housekeeping(self) -> None:
        wanted = {r.model for r in self.requests.values() if r.state == "pending"}
        for d in list(self.deployments.values()):
            if not self.usable(d.server_id):
                continue
            if d.state == "loaded" and d.idle_ttl_s is not None and not d.pinned:
                self.unload_if_idle(d, wanted)
            elif d.preload and d.state == "unloaded" and not self.load_under_way(d.server_id):
                self.preload(d)

    def preload(self, d: DeploymentView) -> None:
        """Load a preload deployment when its server is up and has room without evicting."""
        if self.servers[d.server_id].health != "up":
            return
        if d.next_load_at and d.next_load_at > self.now:
            self.wake_at(d.next_load_at, f"retry preloading {d.model}")
            return
        resident = self.on_server(d.server_id)
        outcome = evictions_for(d, self.servers[d.server_id], resident, self.now, lambda _: False)
        if outcome == ():
            self.start_load(d, (), "preload")

    def unload_if_idle(self, d: DeploymentView, wanted: set[str]) -> None:
        """Unload `d` once idle past its TTL, unless something waits for it or its model."""
        if d.in_flight or self.waiters[d.id] or d.model in wanted:
            return
        if self.load_under_way(d.server_id):
            return
        last = d.last_used_at or d.loaded_at or self.now
        idle_until = last + timedelta(seconds=d.idle_ttl_s)
        if idle_until <= self.now:
            self.decisions.append(Unload(d.id, f"idle for {d.idle_ttl_s:.0f} s"))
            self.set_state(d, "unloading")
        else:
            self.wake_at(idle_until, f"{d.model} idle TTL")

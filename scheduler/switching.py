"""Switching models: the loads a pass starts, and what they may evict. Pure.

`start_new_load` starts the load `place` asks for (a new load, a parallel one beside a long
queue, or one that leaves a long line) where the request is then sent soon first, then with
the least disruption. `room_for` asks `eviction.py` what must leave the server: after a
failed load every idle model, otherwise only models that pass `may_evict` (a request's own
load), `may_evict_for_queue` (a parallel load) or `may_evict_to_leave` (leaving a line),
priced by `holding.py`. A request that no load can serve now because a load that nobody
waits for any more holds its server's load channel stops that load (`stop_load`), on servers
that can stop one.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from . import holding
from . import reasons as waits
from .decisions import StartLoad, StopLoad
from .eviction import NoRoom, evictions_for, keep_value
from .priorities import BACKGROUND, CLASS_NAMES, INTERACTIVE, NORMAL
from .snapshot import DeploymentView, RequestView, ServerView, unused_restore, used_since_loaded

if TYPE_CHECKING:  # for annotations only: policy.py imports this module
    from .policy import Wakes


class Switching:
    """Starting loads (part of step 2, and the preloads of step 4) and choosing what they
    evict. A mixin of `policy._Pass`: it works on the pass's state."""

    def start_new_load(
        self, r: RequestView, free_only: bool = False, leave: DeploymentView | None = None
    ) -> bool:
        """Start a load for `r` with the least disruption: where it is then sent soon first,
        then free room, then the fewest evictions, then the cheapest, then the server with
        the fewest waiting requests, then best fit, then its conversation's last server.
        Fails `r` when no server ever could; otherwise it waits (with a `Defer` when a rule
        lifts at a known time). With `leave` (its model loaded behind a long line there),
        only where `r` is sent soon, evicting only what its wait there is worth
        (`may_evict_to_leave`)."""
        wakes: Wakes = []
        options: list[tuple[tuple, DeploymentView, tuple[int, ...]]] = []
        reasons: list[NoRoom] = []
        orphans: list[DeploymentView] = []  # loads nobody waits for, in its way
        drainable: list[tuple[int, ...]] = []  # busy models it may evict once idle, per server
        candidates = self.candidates(r.model)
        leave_wait_s = None if leave is None else self.wait_in_line_s(r, leave)
        for d in candidates:
            if d.state == "failed":
                message = waits.failed_load(d.model, self.servers[d.server_id].name, d.last_error)
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
                if (orphan := self.orphaned_load(d.server_id)) is not None:
                    orphans.append(orphan)
            elif leave is not None and not self.sent_soon(r, d.server_id):
                continue
            else:
                outcome = self.room_for(d, r, wakes, free_only, leave_wait_s)
                if isinstance(outcome, NoRoom):
                    reasons.append(outcome)
                    if outcome.draining:
                        drainable.append(outcome.draining)
                    continue
                cost = sum(self.victim_cost(self.deployments[e]) for e in outcome)
                waiting = self.routed[d.server_id]
                spare = self.spare_after(d, outcome)
                # Ties go to where its conversation last ran: a server that saves its slots'
                # caches on unload (llama.cpp's --slot-save-path) restores them on a load.
                elsewhere = d.server_id != r.cache_server
                options.append(((len(outcome), cost, waiting, spare, elsewhere, d.id), d, outcome))

        if len(options) > 1:  # where it is sent soon first (the line is counted only then)
            options = [((not self.sent_soon(r, d.server_id), *k), d, e) for k, d, e in options]
        if options:
            _, d, evict = min(options, key=lambda o: o[0])
            if free_only and leave is None:
                why = "a parallel load beside a long queue"
            else:  # what the log says of it: how many it is for, and the best of them
                why = f"{len(self.batch_of(r.model))} waiting, {CLASS_NAMES[r.priority]} first"
                if leave is not None:
                    why += f", behind a long line on {self.servers[leave.server_id].name}"
            self.start_load(d, evict, why, for_request=r)
            self.route_to(r, d, ready=False, reason="load started")
            return True
        if free_only or leave is not None:
            return False
        if orphans:  # no load can start now, but one that nobody waits for can give way
            self.stop_load(orphans[0], r)
        elif drainable:  # or once busy models run dry: on the server where they soonest do
            self.drain(min(drainable, key=self.running_on), r)
        self.wake_times.extend(wakes)
        if r.id not in self.notes:
            until = min((at for at, _ in wakes), default=None)
            homes = {self.servers[d.server_id].name for d in candidates}
            server = homes.pop() if len(homes) == 1 else None
            self.notes[r.id] = waits.no_room(r.model, (n.reason for n in reasons), until, server)
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
        cause: str = "request",
    ) -> None:
        evict = tuple(evict)
        self.decisions.append(StartLoad(d.id, evict, reason, cause))
        # As the store records it: a wait reason counts from this load, not the last one.
        self.set_deployment(d, state="loading", load_started_at=self.now)
        for e in evict:
            self.set_state(self.deployments[e], "unloading")
            # Its waiters go back to routing now, told it was our own eviction.
            server = self.servers[d.server_id].name
            cls = CLASS_NAMES.get(for_request.priority, "") if for_request else ""
            for w in self.waiting_on(e):
                self.requeue(w, f"evicted from {server} for {d.model} ({cls})")

    def running_on(self, busy: tuple[int, ...]) -> tuple[int, int]:
        return sum(self.deployments[d].in_flight for d in busy), min(busy)

    def drain(self, busy: tuple[int, ...], r: RequestView) -> None:
        """`r`'s load may evict these models once they are idle: they take no more work of a
        worse class than `r`'s, so that they run dry instead of serving that work first
        while `r` waits (`Dispatching.free_slot_for`)."""
        mine = self.effective(r)
        for d in busy:
            self.drains[d] = min(self.drains.get(d, mine), mine)

    def orphaned_load(self, server_id: int) -> DeploymentView | None:
        """The load under way on `server_id` if nobody waits for it any more (its requests
        cancelled, expired or served elsewhere) and the server can stop it: the only thing
        under way there (no eviction of its own left to finish), not a preload, and not of
        a model more requests may wait for than the snapshot holds."""
        if not self.servers[server_id].stops_loads:
            return None
        busy = [x for x in self.on_server(server_id) if x.state in ("loading", "unloading")]
        if len(busy) != 1 or busy[0].state != "loading":
            return None
        d = busy[0]
        if self.waiting_on(d.id) or d.load_cause in ("preload", "operator"):
            return None
        if d.model in self.unseen:
            return None
        return d

    def stop_load(self, d: DeploymentView, r: RequestView) -> None:
        """Stop `d`'s load, which nobody waits for, so that `r`'s can start once it is
        `unloaded` (a later pass). It is `unloading` for the rest of this pass: the load
        channel stays busy until then."""
        server = self.servers[d.server_id].name
        self.decisions.append(StopLoad(d.id, f"gives way to a load of {r.model}"))
        self.set_state(d, "unloading")
        self.notes[r.id] = waits.stopping(r.model, d.model, server)

    def room_for(
        self,
        d: DeploymentView,
        r: RequestView,
        wakes: "Wakes",
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
        self, victim: DeploymentView, r: RequestView, target: DeploymentView, wakes: "Wakes"
    ) -> bool:
        """May `r`'s load of `target` evict the idle `victim`? The rules, in order: not used
        since loaded, no wasted load, a request about to expire, priced collation, minimum
        residency, the priced hold (see `holding.py`)."""
        server = self.servers[target.server_id]
        mine = self.effective(r)
        theirs = self.waiting_on(victim.id)
        # A restore not used yet: a guess holds no real work back.
        if unused_restore(victim) and not theirs:
            return True
        # No wasted load: a load serves the requests that waited for it before it may go.
        # Once it has served one it was not wasted, and the rest of its batch is weighed by
        # collation below (a person is not held behind a whole background batch).
        if (
            victim.loaded_at
            and not used_since_loaded(victim)
            and (waited := sum(w.created_at <= victim.loaded_at for w in theirs))
        ):
            self.note(
                r, waits.held("no_wasted_load", server.name, victim.model, None, waited=waited)
            )
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
            # Only against a lower class: at equal classes a request that waits now is not
            # held for the next user the model may or may not have (collation and no wasted
            # load already keep it for requests that do wait for it).
            if resident_until > self.now and users and mine > min(users):
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
        back_s = self.load_s(victim)
        if protected and one_room(server, victim, target):
            back_s += self.run_s(target)
        save = holding.hold_saving(
            back_s, protected, self.load_s(target) if batching else 0.0, mine
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
        if unused_restore(victim):
            return 0.0
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

    def run_s(self, d: DeploymentView) -> float:
        return d.avg_inference_s or self.config.default_run_s

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


def one_room(server: ServerView, victim: DeploymentView, target: DeploymentView) -> bool:
    """`victim` can come back to `server` only by evicting `target`: the server holds one
    model at a time (`max_models` 1, a router's `--models-max 1`), or one of their type."""
    if server.max_models == 1:
        return True
    return victim.model_type == target.model_type and server.capacity.get(target.model_type, 1) <= 1

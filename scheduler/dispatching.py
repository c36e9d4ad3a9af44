"""Steps 3 and 5 of a pass: dispatch ready requests into free slots, and say what each full
server's slots take next and where a request that arrives next is sent (`policy.py` lists
the steps). Pure.
"""

from collections import Counter

from . import fair_share
from . import reasons as waits
from .decisions import Dispatch, SendNext, SendOnArrival
from .snapshot import DeploymentView, RequestView


class Dispatching:
    """Steps 3 (`dispatch`) and 5 (`send_next`, `send_on_arrival`). A mixin of `policy._Pass`:
    it works on the pass's state."""

    def fairly(self, ranked: list[RequestView]) -> list[RequestView]:
        """Within each class, teams and API keys share the slots by weight (see fair_share)."""
        return fair_share.fair_order(ranked, self.level, self.shares)

    def dispatch(self) -> None:
        for r in self.fairly(self.ranked("ready")):
            if not self.any_free_slot():
                # The rest waits; a slot that frees wakes the loop (retries' times included).
                return
            if self.backing_off(r):
                self.wake_at(r.not_before, "retry a request")
                continue
            if not self.quota.allows(r):  # its key's or team's quota is full: one of its own
                continue  # ends first
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

    def room(self, d: DeploymentView) -> int:
        """Requests `d` may take now: its server's free slots, and no more than its own
        (`slots`, the server's setting for that model) leave."""
        free = self.servers[d.server_id].slots - self.in_flight[d.server_id]
        return free if d.slots is None else min(free, d.slots - d.in_flight)

    def free_slot_for(self, r: RequestView) -> DeploymentView | None:
        """Its own deployment if it has a free slot, else another server with its model
        loaded and a free slot (its conversation's last server first): a queue on a busy
        server drains onto an idle one."""
        own = self.deployments[r.deployment_id]
        others = sorted(
            self.candidates(r.model, "loaded"),
            key=lambda d: (d.server_id != r.cache_server, d.id),
        )
        for d in [own, *others]:
            if d.state == "loaded" and self.room(d) > 0:
                drained_for = self.drains.get(d.id)  # the class its drain is for, if any
                if drained_for is not None and drained_for < self.effective(r):
                    server = self.servers[d.server_id].name
                    self.note(r, waits.held("draining", server, d.model, None))
                    continue
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
        quota = self.quota.copy()  # a request sent next takes a slot of its quotas
        for s in full:
            here = sorted(self.on_server(s.id), key=lambda d: d.id)
            if any(d.model in unplaced for d in here):
                continue
            loaded: dict[str, DeploymentView] = {}
            for d in here:
                if d.state == "loaded" and d.enabled:
                    loaded.setdefault(d.model, d)
            nexts = 0
            per_model: Counter[int] = Counter()  # no more for a model than its own slots
            for r in ready:
                own = self.deployments.get(r.deployment_id) if r.deployment_id else None
                d = own if own is not None and own.server_id == s.id else loaded.get(r.model)
                if d is None or d.state != "loaded" or not quota.allows(r):
                    continue
                if d.slots is not None and per_model[d.id] >= d.slots:
                    continue
                per_model[d.id] += 1
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
            room = self.room(d)
            if room > 0:
                self.decisions.append(SendOnArrival(model, d.id, d.server_id, room))

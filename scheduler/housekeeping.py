"""Step 4 of a pass, housekeeping: unload models idle past their TTL, preload marked
deployments (`policy.py` lists the steps). Pure.
"""

from datetime import timedelta

from .decisions import Unload
from .eviction import evictions_for
from .snapshot import DeploymentView


class Housekeeping:
    """Step 4, models nobody asked for. A mixin of `policy._Pass`: it works on the pass's
    state."""

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

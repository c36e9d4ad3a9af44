"""Step 4 of a pass, housekeeping: unload models idle past their TTL, preload marked
deployments and those within their keep-loaded hours, and load back on an idle server the
model interactive work used lately (`policy.py` lists the steps). Pure.
"""

from datetime import datetime, timedelta

from backends import keep_loaded

from . import holding
from .decisions import Unload
from .eviction import evictions_for
from .snapshot import DeploymentView, unused_restore


class Housekeeping:
    """Step 4, models nobody asked for. A mixin of `policy._Pass`: it works on the pass's
    state."""

    def housekeeping(self) -> None:
        wanted = {r.model for r in self.requests.values() if r.state == "pending"}
        for d in list(self.deployments.values()):
            if not self.usable(d.server_id):
                continue
            if not d.enabled:
                self.unload_disabled(d)
                continue
            kept, change = self.keep_loaded_now(d)
            self.wake_at(change, f"keep-loaded hours of {d.model}")
            if d.state == "loaded" and d.idle_ttl_s is not None and not d.pinned and not kept:
                self.unload_if_idle(d, wanted)
            elif d.state != "unloaded" or self.load_under_way(d.server_id):
                continue
            elif kept and not self.routed[d.server_id]:
                why = f"keep-loaded hours {d.keep_loaded_hours}"
                self.preload(d, self.may_evict_to_keep_loaded, why)
            elif d.preload:
                self.preload(d)
        if self.config.restore_window_s > 0:
            # Only servers holding a model we evicted may restore one: most passes, none.
            out = {d.server_id for d in self.deployments.values() if d.displaced}
            for server_id in sorted(out):
                self.restore(server_id, wanted)

    def preload(self, d: DeploymentView, may_evict=lambda _: False, why: str = "preload") -> None:
        """Load a preload deployment when its server is up and has room (without evicting,
        unless `may_evict` says so)."""
        if self.servers[d.server_id].health != "up":
            return
        if d.next_load_at and d.next_load_at > self.now:
            self.wake_at(d.next_load_at, f"retry preloading {d.model}")
            return
        resident = self.on_server(d.server_id)
        server = self.servers[d.server_id]
        outcome = evictions_for(
            d, server, resident, self.now, may_evict, self.config.default_load_s
        )
        if isinstance(outcome, tuple):
            self.start_load(d, outcome, why, cause="preload")

    def keep_loaded_now(self, d: DeploymentView) -> tuple[bool, datetime | None]:
        """Whether `d` is within its keep-loaded hours, and when that changes. Hours that do
        not parse (the admin and the config file refuse them) keep nothing loaded."""
        if not d.keep_loaded_hours:
            return False, None
        try:
            return keep_loaded.where(d.keep_loaded_hours, self.now, self.config.time_zone)
        except ValueError:
            return False, None

    def may_evict_to_keep_loaded(self, victim: DeploymentView) -> bool:
        """A load for keep-loaded hours evicts what a restore may (idle, nobody waiting,
        past its residency), but no model preloaded or within its own hours."""
        if victim.preload or self.keep_loaded_now(victim)[0]:
            return False
        return self.may_evict_to_restore(victim)

    def unload_disabled(self, d: DeploymentView) -> None:
        """A disabled model leaves its server once its requests there have finished (none
        are sent there any more), pinned or not."""
        if d.state == "loaded" and not d.in_flight and not self.load_under_way(d.server_id):
            self.decisions.append(Unload(d.id, "disabled by an operator"))
            self.set_state(d, "unloading")

    def unload_if_idle(self, d: DeploymentView, wanted: set[str]) -> None:
        """Unload `d` once idle past its TTL, unless something waits for it or its model."""
        if d.in_flight or self.waiters[d.id] or d.model in wanted:
            return
        if self.load_under_way(d.server_id):
            return
        last = d.last_used_at or d.loaded_at or self.now
        idle_until = last + timedelta(seconds=d.idle_ttl_s)
        if idle_until <= self.now:
            self.decisions.append(Unload(d.id, f"idle for {d.idle_ttl_s:.0f} s", if_unused=True))
            self.set_state(d, "unloading")
        else:
            self.wake_at(idle_until, f"{d.model} idle TTL")

    def restore(self, server_id: int, wanted: set[str]) -> None:
        """Restore on idle: a server that can stop a load, with nothing running, routed or
        loading there and no request waiting for a model it holds, loads back the model
        interactive work used within `restore_window_s` that is loaded nowhere, evicting only
        idle models nobody waits for past their minimum residency, when that pays
        (`holding.restore_pays`; of several, the one with the highest `load_s / since_s`).
        Nobody waits for its load, so it gives way to a request that needs the server
        (`orphaned_load`), and the model keeps no residency until a request uses it
        (`unused_restore`)."""
        server = self.servers[server_id]
        if not server.stops_loads or not self.usable(server_id) or server.health != "up":
            return
        if self.in_flight[server_id] or self.routed[server_id] or self.load_under_way(server_id):
            return
        here = self.on_server(server_id)
        if any(d.model in wanted for d in here):
            return
        best: tuple[float, float, DeploymentView, tuple[int, ...]] | None = None
        for d in here:
            since = self.since_interactive_use(d)
            if since is None or (d.next_load_at and d.next_load_at > self.now):
                continue
            outcome = evictions_for(
                d, server, here, self.now, self.may_evict_to_restore, self.config.default_load_s
            )
            if not isinstance(outcome, tuple):
                continue
            cost = sum(self.victim_cost(self.deployments[e]) for e in outcome)
            value = self.load_s(d) / max(since, 1.0)
            if holding.restore_pays(self.load_s(d), since, cost) and (
                best is None or value > best[0]
            ):
                best = (value, since, d, outcome)
        if best is not None:
            _, since, d, evict = best
            why = f"restore: interactive work used {d.model} {since:.0f} s ago"
            self.start_load(d, evict, why, cause="restore")

    def since_interactive_use(self, d: DeploymentView) -> float | None:
        """Seconds since interactive work last used `d`'s model anywhere, if `d` may be
        restored: unloaded by us to make room (`displaced`: not by an operator, its idle TTL
        or the server itself), its model loaded nowhere, used within `restore_window_s` and,
        with an idle TTL, within that too (a restore must not undo the TTL's unload)."""
        if d.state != "unloaded" or not d.displaced or not d.enabled:
            return None
        homes = [x for x in self.deployments.values() if x.model == d.model]
        if any(x.state in ("loading", "loaded") for x in homes):
            return None
        last = max((x.last_interactive_at for x in homes if x.last_interactive_at), default=None)
        if last is None:
            return None
        since = (self.now - last).total_seconds()
        window = self.config.restore_window_s
        if d.idle_ttl_s is not None:
            window = min(window, d.idle_ttl_s)
        return since if since < window else None

    def may_evict_to_restore(self, victim: DeploymentView) -> bool:
        """A restore evicts only idle models nobody waits for, past their minimum residency."""
        if self.waiting_on(victim.id):
            return False
        if unused_restore(victim) or not victim.loaded_at:
            return True
        return self.resident_until(victim) <= self.now

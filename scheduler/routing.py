"""Step 2 of a pass, routing pending requests (`policy.py` lists the steps). Pure.

Best first, in two rounds: `route_quietly` takes the routes that disturb nothing, then
`place` the rest, some of them with a new load (`start_new_load`).
"""

from datetime import timedelta

from . import reasons as waits
from .decisions import Fail, Route
from .snapshot import DeploymentView, RequestView

# Said of a route to the server that took the request's conversation's last turn (the
# send-on-arrival fast path says it too).
AT_CONVERSATION = "where its conversation's last turn ran"


class Routing:
    """Step 2, routing pending requests. A mixin of `policy._Pass`: it works on the pass's state."""

    def route_pending(self) -> None:
        later = []
        for r in self.ranked("pending"):
            if not r.model:  # its model was deleted: the snapshot reads no name for it
                self.fail(r, "model_not_found", "its model was deleted while it waited")
            elif r.model not in self.deployed:
                self.fail(r, "model_not_deployed", f"no server has a deployment of {r.model}")
            elif (why := self.why_nothing_serves(r.model)) is not None:
                self.no_server(r, why)
            elif not self.route_quietly(r):
                later.append(r.id)
        for rid in later:
            self.place(self.requests[rid])

    def why_nothing_serves(self, model: str) -> str | None:
        """Why no server can serve `model` now ("gpu-a down; gpu-b in cooldown until …"),
        or None when one can (or may after a wait of known length, as a load's backoff)."""
        seen = self.unservable.get(model)
        if seen is not None and seen[0] == self.deployment_changes:
            return seen[1]
        reasons, down = [], False
        for d in sorted(self.deployments.values(), key=lambda d: d.id):
            if d.model != model:
                continue
            s = self.servers[d.server_id]
            down = down or not self.usable(s.id) or not d.enabled
            since = f" since {s.unavailable_since:%H:%M:%S}" if s.unavailable_since else ""
            if not d.enabled:
                reasons.append(f"{model} is disabled on {s.name}")
            elif not s.enabled:
                reasons.append(f"{s.name} is disabled{since}")
            elif s.health == "down":
                reasons.append(f"{s.name} is down{since}")
            elif not self.usable(s.id):
                until = f" until {s.cooldown_until:%H:%M:%S}" if s.cooldown_until else ""
                reasons.append(f"{s.name} is in cooldown{until}")
            elif d.state == "failed":
                reasons.append(waits.failed_load(model, s.name, d.last_error))
            else:
                reasons, down = [], False
                break
        # Every deployment failed for good: the load rules fail it at once, with their code.
        why = "; ".join(reasons) if down else None
        self.unservable[model] = (self.deployment_changes, why)
        return why

    def no_server(self, r: RequestView, why: str) -> None:
        """Fail fast: after its grace, a request whose model no server can serve fails with
        `no_server_available`; until then it waits (a server may come back)."""
        grace = r.no_server_grace_s
        if grace is None:
            grace = self.config.no_server_grace_s
        since = max(
            [r.created_at]
            + [
                s.unavailable_since
                for d in self.deployments.values()
                if d.model == r.model
                and (s := self.servers[d.server_id]).unavailable_since is not None
            ]
        )
        deadline = since + timedelta(seconds=grace)
        if deadline <= self.now:
            self.fail(r, "no_server_available", f"no server can serve {r.model}: {why}")
        else:
            self.wake_at(deadline, f"no server can serve {r.model}")
            self.notes[r.id] = waits.no_server(r.model, why, deadline)

    def route_quietly(self, r: RequestView) -> bool:
        """Routes that disturb nothing: loaded with room or a short queue and no long line
        ahead; a load under way."""
        loaded = self.least_busy(self.candidates(r.model, "loaded"), r.cache_server)
        if loaded is not None and not self.crowded(loaded) and not self.long_line(r, loaded):
            self.route_to(r, loaded, ready=True, reason="model loaded there")
            return True
        loading = self.least_busy(self.candidates(r.model, "loading"))
        if loaded is None and loading is not None and not self.crowded_load(loading):
            self.route_to(r, loading, ready=False, reason="joins the load under way")
            return True
        return False

    def place(self, r: RequestView) -> None:
        """Routes that cost something, best request first."""
        seen = self.held_back.get(r.model)
        if seen is not None and seen[0] == self.deployment_changes:
            # As the request before it of that model fared: a later one ranks no higher, so
            # no rule lets it through, and what fails them is the deployments'. A deep line
            # for a model that no server can take now is hundreds of them, pass after pass.
            if seen[1] is not None:
                self.fail(r, seen[1].code, seen[1].message)
            elif (head := self.held_heads.get(r.model)) in self.notes:
                self.notes[r.id] = self.notes[head]
            return
        loaded = self.least_busy(self.candidates(r.model, "loaded"), r.cache_server)
        loading = self.least_busy(self.candidates(r.model, "loading"))
        if loaded is not None:
            # A long line ahead of it there: load it where it is sent soon, if that pays.
            if loading is None and self.leaves_line(r, loaded):
                return
            # A long queue for a busy model: load it where there is free room, else queue.
            if (
                loading is not None
                or not self.crowded(loaded)
                or not self.start_new_load(r, free_only=True)
            ):
                self.route_to(r, loaded, ready=True, reason="model loaded there, queued")
        elif loading is not None:
            # A long batch behind one load: a second load where there is room drains it
            # twice as fast once both are done.
            if not self.crowded_load(loading) or not self.start_new_load(r, free_only=True):
                self.route_to(r, loading, ready=False, reason="joins the load under way")
        elif not self.start_new_load(r):
            failed = self.decisions[-1] if r.id not in self.requests else None
            assert failed is None or isinstance(failed, Fail)
            self.held_back[r.model] = (self.deployment_changes, failed)
            self.held_heads[r.model] = r.id

    def crowded(self, d: DeploymentView) -> bool:
        """No free slot (its server's, or its model's own), and enough requests queue for
        this model there to load it twice."""
        queued = self.ready_on_deployment[d.id]
        own_full = d.slots is not None and d.in_flight + queued >= d.slots
        if self.busyness(d.server_id) < 1 and not own_full:
            return False
        return queued >= self.config.parallel_load_queue

    def soon_rank(self, r: RequestView) -> tuple:
        """Where `r` will rank within one aging step at most: one class better (a rescued
        request is already first)."""
        if self.rescued(r):
            return self.rank(r)
        return (self.effective(r) - 1, r.created_at, r.id)

    def line_ahead(self, r: RequestView, server_id: int, enough: int) -> int:
        """The requests that a slot of `server_id` sends before `r`, now or within one aging
        step (routed there, or ready for a model loaded there), counted up to `enough`."""
        if self.soon_order is None:
            ranks = {q.id: self.soon_rank(q) for q in self.requests.values()}
            self.soon_order = sorted(ranks.items(), key=lambda item: item[1])
        mine = self.rank(r)
        here = {d.model for d in self.on_server(server_id) if d.state == "loaded"}
        count = 0
        for qid, soon in self.soon_order:
            if soon >= mine:
                break
            w = self.requests.get(qid)
            if w is None or w.id == r.id or w.deployment_id is None:
                continue
            at = self.deployments.get(w.deployment_id)
            if at is not None and (
                at.server_id == server_id or (w.state == "ready" and w.model in here)
            ):
                count += 1
                if count >= enough:
                    break
        return count

    def long_line(self, r: RequestView, d: DeploymentView) -> bool:
        """`d`'s server has no free slot, `r`'s model could load on another server, and at
        least `slots + parallel_load_queue` requests there go before `r` within an aging
        step: `r` may load its model where it is sent soon (`start_new_load(leave=…)`)."""
        server = self.servers[d.server_id]
        if self.in_flight[server.id] < server.slots:
            return False
        if not any(c.state == "unloaded" for c in self.candidates(r.model)):
            return False
        enough = server.slots + self.config.parallel_load_queue
        return self.line_ahead(r, server.id, enough) >= enough

    def leaves_line(self, r: RequestView, loaded: DeploymentView) -> bool:
        """Behind a long line of other work on `loaded`'s server, `r` loads its model where
        it is sent soon if that pays (a long queue of its own model is priced as a parallel
        load instead: that load drains the whole queue). A model that found no such load
        waits alike until a deployment changes (the requests behind rank no higher)."""
        if self.crowded(loaded) or self.no_leave.get(r.model) == self.deployment_changes:
            return False  # a long queue of its own model: a parallel load's price
        if not self.long_line(r, loaded):
            return False
        if self.start_new_load(r, leave=loaded):
            return True
        self.no_leave[r.model] = self.deployment_changes
        return False

    def wait_in_line_s(self, r: RequestView, loaded: DeploymentView) -> float:
        """`r`'s wait behind the line on `loaded`'s server, at the default run time a
        request (what leaving it saves)."""
        there = self.servers[loaded.server_id]
        line = self.line_ahead(r, there.id, len(self.requests))
        return line * self.config.default_run_s / max(there.slots, 1)

    def sent_soon(self, r: RequestView, server_id: int) -> bool:
        """Fewer requests than its slots go before `r` on `server_id` within an aging step."""
        slots = self.servers[server_id].slots
        return self.line_ahead(r, server_id, slots) < slots

    def crowded_load(self, d: DeploymentView) -> bool:
        """Enough requests wait for this load that, once it is done, `parallel_load_queue`
        of them still queue behind its server's slots."""
        slots = self.servers[d.server_id].slots
        if d.slots is not None:
            slots = min(slots, d.slots)
        return len(self.waiters[d.id]) >= slots + self.config.parallel_load_queue

    def route_to(self, r: RequestView, d: DeploymentView, ready: bool, reason: str) -> None:
        server = self.servers[d.server_id].name
        if ready and d.server_id == r.cache_server:
            reason += f", {AT_CONVERSATION}"
        self.decisions.append(Route(r.id, d.id, ready, f"{reason} ({server})"))
        self.set_request(r, state="ready" if ready else "needs_loading", deployment_id=d.id)

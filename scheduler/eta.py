"""The ETA: how many seconds until a waiting request is sent to a server. Pure, like the
policy: the dashboard feeds it the database's picture, the simulation its own.

The forecast plays the line forward in the order given (the policy's order: class, aged,
then arrival): each request goes where it would start first among its model's deployments
(or the one it is routed to), after what is left of a load under way, or after a load of
its own (one at a time per server, evicting the least recently used model of its type when
the server is full, once the head of that model's queue that the policy's collation serves
first has run), after a slot frees, and after its caller's quota has room. A slot frees
when a request's expected run ends. Expected times come from history: a deployment's
moving average of load time and of run time.

How good it is gets measured, not assumed (`eta_accuracy`)."""

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from . import holding
from .snapshot import PolicyConfig

# Below this a server's load fraction says too little to scale from (a first tick).
MIN_REPORTED = 0.05
DEFAULT_RUN_S = 5.0  # before any request of any model has run
DEFAULT_CONFIG = PolicyConfig()


def expected_run_s(means: Mapping[Hashable, float], model: Hashable) -> float:
    """What a model's requests are expected to run, from each model's mean run time so far:
    its own, else (it never ran) the mean of the models that have run, else DEFAULT_RUN_S."""
    if model in means:
        return means[model]
    return sum(means.values()) / len(means) if means else DEFAULT_RUN_S


def token_line(runs: Iterable[tuple[float, int]]) -> tuple[float, float] | None:
    """(base_s, token_s): the line `run = base_s + token_s × generated tokens` that fits
    these runs best (least squares): what a request takes before its first token (its
    prompt) and per token after. None while the runs generated fewer than two different
    counts of tokens: with one count, the prompt's part and the tokens' cannot be told
    apart. Neither part is below 0 (a line through 0 instead, or a flat one)."""
    pairs = [(float(n), ran) for ran, n in runs]
    if len({n for n, _ in pairs}) < 2:
        return None
    mean_n = sum(n for n, _ in pairs) / len(pairs)
    mean_run = sum(ran for _, ran in pairs) / len(pairs)
    spread = sum((n - mean_n) ** 2 for n, _ in pairs)
    token_s = sum((n - mean_n) * (ran - mean_run) for n, ran in pairs) / spread
    if token_s <= 0:
        return mean_run, 0.0
    base_s = mean_run - token_s * mean_n
    if base_s < 0:
        return 0.0, sum(n * ran for n, ran in pairs) / sum(n * n for n, _ in pairs)
    return base_s, token_s


@dataclass(frozen=True, slots=True)
class Place:
    """A deployment as the forecast sees it. `busy_s`: what is left of each request it
    runs now; `idle_s`: seconds since it was last used (the eviction order)."""

    id: int
    server_id: int
    model: Hashable  # its name, or any key the waiters use too
    state: str  # loaded, loading, unloading, unloaded, failed
    load_s: float
    run_s: float
    model_type: str = "llm"
    load_left_s: float = 0.0
    busy_s: tuple[float, ...] = ()
    idle_s: float = 0.0
    slots: int | None = None  # its own, where fewer than its server's (llama-server's -np)
    # Loaded and not used since: the policy keeps it for a request that waited for it.
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class Host:
    id: int
    slots: int = 1
    capacity: dict[str, int] = field(default_factory=lambda: {"llm": 1})
    available: bool = True
    max_models: int | None = None  # of every type together, as `ServerView.max_models`

    def full(self, resident: int) -> bool:
        """Whether `resident` models in all leave no room for one more."""
        return self.max_models is not None and resident >= self.max_models


@dataclass(frozen=True, slots=True)
class Waiter:
    id: Hashable
    model: Hashable
    deployment_id: int | None = None
    run_s: float | None = None  # its expected run, if known better than its model's
    # Seconds until the policy lets it go at the earliest (a hold's end, a retry's backoff),
    # as its reason says: only the policy knows its holds.
    not_before_s: float = 0.0
    # The class it waits in after aging (`line_order`), as the policy weighs it (NORMAL).
    effective_class: int = 2
    caps: tuple[Hashable, ...] = ()  # its caller's quotas (`Cap`): its key's, its team's

    def run_on(self, p: Place) -> float:
        """Its expected run on `p`."""
        return p.run_s if self.run_s is None else self.run_s


@dataclass(frozen=True, slots=True)
class Cap:
    """A caller's quota (a key's or a team's `max_processing`): at most `limit` of its
    requests at servers at once. `busy_s`: what is left of each one it runs now."""

    id: Hashable
    limit: int
    busy_s: tuple[float, ...] = ()


def line_order(priority: int, waited_s: float, aging_step_s: float) -> int:
    """The class a request waits in after aging (one class up per step waited), as the
    policy ranks it; sort by this, then by arrival."""
    if aging_step_s <= 0:
        return priority
    return max(priority - int(waited_s // aging_step_s), 0)


def load_left_s(load_s: float, elapsed_s: float, reported: float | None = None) -> float:
    """What is left of a load under way after `elapsed_s`: by its server's own figure
    when it `reported` one (the time so far, scaled by what remains), else the estimate
    `load_s` less the time so far. A first load's estimate is a guess; the server knows."""
    if reported is not None and reported >= 1.0:
        return 0.0
    if reported is not None and reported >= MIN_REPORTED and elapsed_s > 0:
        return elapsed_s * (1.0 - reported) / reported
    return max(load_s - elapsed_s, 0.0)


class _Server:
    def __init__(self, host: Host, places: list[Place]) -> None:
        self.host = host
        self.slots = _free_slots([b for p in places for b in p.busy_s], host.slots)
        # A model with fewer slots of its own runs no more at once (the others wait in line).
        self.own = {
            p.id: _free_slots(p.busy_s, p.slots) for p in places if p.slots and p.slots < host.slots
        }
        loading = [p.load_left_s for p in places if p.state == "loading"]
        self.load_free = max(loading, default=0.0)
        self.resident = {p.id for p in places if p.state in ("loaded", "loading")}
        # When the work placed here so far would be done, spread over its slots.
        self.backlog = sum(self.slots) / host.slots

    def lanes(self, p: Place) -> int:
        """How many of `p`'s requests run at once here."""
        return min(p.slots or self.host.slots, self.host.slots)


def _free_slots(busy_s: Iterable[float], slots: int) -> list[float]:
    """A heap of when each of `slots` slots frees, the busiest `busy_s` in them."""
    busy = sorted(busy_s)[:slots]
    free = busy + [0.0] * max(slots - len(busy), 0)
    heapq.heapify(free)
    return free


def forecast(
    hosts: Iterable[Host],
    places: Iterable[Place],
    line: Iterable[Waiter],
    unload_s: float = 0.0,
    config: PolicyConfig = DEFAULT_CONFIG,
    caps: Iterable[Cap] = (),
) -> dict[Hashable, float | None]:
    """Seconds from now until each request in `line` (in line order) is sent; None for one
    that no available server can serve.

    Two steps. Where: in line order, each request goes to its routed deployment (served
    there before the model can leave, if the model is there now), else to
    the deployment of its model where it would start first: when the model is ready there
    or the work already placed on that server is done, whichever is later. Only where the
    model is (loaded or loading) if it is anywhere; else after a load of its own (one at
    a time per server), or also where it can be loaded without evicting anything once that
    many queue for it and the servers that hold it are busy (`parallel_load_queue`), as the
    policy does. A load that must evict a model with a queue (requests routed to it, or
    routed nowhere yet where it is their model's only home) waits for the head of that
    queue, down to the first class the load's batch outranks by the policy's priced
    collation (`holding.outranks`); the rest wait for a reload. At equal classes the whole
    queue goes first. When: per server, as each slot frees, the best placed
    request whose model is ready by then is sent (a loaded model's requests go ahead of
    those waiting for a load, as the policy sends them). Then its caller's quotas (`caps`):
    a request goes no sooner than one of their units frees, its caller's requests in the
    order the forecast sends them (rough: the slot it leaves to others meanwhile is not
    given to them)."""
    found = _Forecast(hosts, places, line, unload_s, config)
    return _within_caps(found.run(), found, {c.id: c for c in caps})


class _Forecast:
    """One forecast's working state (see `forecast`)."""

    def __init__(
        self,
        hosts: Iterable[Host],
        places: Iterable[Place],
        line: Iterable[Waiter],
        unload_s: float,
        config: PolicyConfig,
    ) -> None:
        hosts = {h.id: h for h in hosts if h.available}
        self.places = {p.id: p for p in places if p.server_id in hosts and p.state != "failed"}
        self.by_model: dict[Hashable, list[Place]] = {}
        for p in self.places.values():
            self.by_model.setdefault(p.model, []).append(p)
        self.servers = {
            h.id: _Server(h, [p for p in self.places.values() if p.server_id == h.id])
            for h in hosts.values()
        }
        self.unload_s, self.config = unload_s, config
        self.ready_at = {
            p.id: (0.0 if p.state == "loaded" else p.load_left_s)
            for p in self.places.values()
            if p.state in ("loaded", "loading")
        }
        self.work = {p.id: max(p.busy_s, default=0.0) for p in self.places.values()}
        # Requests served on a model before it can leave: (from when, where). Per place, those
        # of them not yet placed and their share of its work.
        self.kept: dict[Hashable, tuple[float, int]] = {}
        self.kept_ahead: dict[int, dict[Hashable, Waiter]] = {p: {} for p in self.places}
        self.kept_work = dict.fromkeys(self.places, 0.0)
        # Each model's requests routed nowhere yet and not yet placed, in line order.
        self.pending: dict[Hashable, dict[Hashable, Waiter]] = {}
        self.line = list(line)
        self.rank = {w.id: i for i, w in enumerate(self.line)}
        # A request already routed to a model that is there (loaded, or joined to its load)
        # is served there before the model can leave, unless a better class's load sends it
        # back (`evict`): its run is counted on the model from the start, so an eviction
        # placed for a request ahead of it waits for it.
        for w in self.line:
            p = self.places.get(w.deployment_id) if w.deployment_id is not None else None
            if p is not None and p.id in self.ready_at:
                self.keep(w, p, self.ready_at[p.id])
            elif w.deployment_id is None:
                self.pending.setdefault(w.model, {})[w.id] = w
        self.queues: dict[int, list[tuple[int, Hashable, float, float, int]]] = {
            h: [] for h in self.servers
        }
        self.queued = dict.fromkeys(self.places, 0)
        self.run_of: dict[Hashable, float] = {}  # each placed request's expected run

    def keep(self, w: Waiter, p: Place, ready: float) -> None:
        self.kept[w.id] = (max(ready, w.not_before_s), p.id)
        share = w.run_on(p) / self.servers[p.server_id].lanes(p)
        self.work[p.id] = max(self.work[p.id], self.kept[w.id][0]) + share
        self.kept_ahead[p.id][w.id] = w
        self.kept_work[p.id] += share

    def queue_on(self, victim: int) -> list[Waiter]:
        """The requests `victim`'s model would serve before it leaves, in line order: those
        routed to it, and those of its model routed nowhere yet where it is the model's only
        home (the policy routes them to it on its next pass)."""
        model = self.places[victim].model
        homes = [p for p in self.by_model[model] if p.id in self.ready_at]
        unrouted = self.pending.get(model, {}) if homes == [self.places[victim]] else {}
        queue = [*self.kept_ahead[victim].values(), *unrouted.values()]
        return sorted(queue, key=lambda q: self.rank[q.id])

    def split_queue(self, w: Waiter, p: Place, victim: int) -> tuple[list[Waiter], list[Waiter]]:
        """`victim`'s queue as (served before `w`'s load of `p` may evict it, sent back):
        the head down to the first class whose rest `w`'s batch outranks (the policy's
        priced collation, weighed again as the queue drains), else all of it. A model
        loading or loaded and unused serves one first (no wasted load)."""
        queue = self.queue_on(victim)
        classes = [q.effective_class for q in queue]
        batch = [b.effective_class for b in self.pending.get(w.model, {}).values()]
        v = self.places[victim]
        first = 1 if v.state == "loading" or v.fresh else 0
        for k, c in enumerate(classes):
            if k < first:
                continue
            if (k == first or c != classes[k - 1]) and holding.outranks(
                batch or [w.effective_class],
                classes[k:],
                p.load_s,
                v.load_s,
                self.servers[p.server_id].host.slots,
                self.config,
            ):
                return queue[:k], queue[k:]
        return queue, []

    def free_at(self, w: Waiter, p: Place, victim: int) -> float:
        """When `victim` may leave for `w`'s load of `p`."""
        return self.gone_at(victim, self.split_queue(w, p, victim)[0])

    def gone_at(self, victim: int, served: list[Waiter]) -> float:
        """When `victim` may leave: once what runs there and `served` have run."""
        v = self.places[victim]
        left = sum(q.run_on(v) for q in served) / self.servers[v.server_id].lanes(v)
        return self.work[victim] - self.kept_work[victim] + left

    def evict(self, w: Waiter, p: Place, victim: int) -> None:
        """`w`'s load of `p` evicts `victim`: the head of its queue is served there first,
        the rest is sent back to wait for a reload."""
        served, sent_back = self.split_queue(w, p, victim)
        gone = self.gone_at(victim, served)
        for q in served:
            self.kept[q.id] = (max(self.ready_at[victim], q.not_before_s), victim)
            self.pending.get(q.model, {}).pop(q.id, None)
        for q in sent_back:
            self.kept.pop(q.id, None)
        self.work[victim] = gone
        self.kept_ahead[victim], self.kept_work[victim] = {}, 0.0
        self.servers[p.server_id].resident.discard(victim)
        self.ready_at.pop(victim, None)

    def options(self, w: Waiter, routed: Place | None) -> list[Place]:
        """Where `w` may go. The policy loads a model elsewhere only when it must, or where
        there is free room once a queue builds for it: otherwise it waits where the model
        is."""
        options = [routed] if routed else self.by_model.get(w.model, [])
        resident = [p for p in options if p.id in self.ready_at]
        if resident and not routed:
            crowded = all(
                self.queued[p.id] >= self.config.parallel_load_queue
                and self.servers[p.server_id].backlog > 0
                for p in resident
            )
            loading = any(self.ready_at[p.id] > 0 for p in resident)
            roomy = [
                p
                for p in options
                if p.id not in self.ready_at and _room(p, self.servers, self.places)
            ]
            options = resident + (roomy if crowded and not loading else [])
        return options

    def place(self, rank: int, w: Waiter) -> None:
        routed = self.places.get(w.deployment_id) if w.deployment_id is not None else None
        self.pending.get(w.model, {}).pop(w.id, None)
        best = None
        if w.id in self.kept:
            ready, where = self.kept[w.id]
            routed = self.places[where]
            best = (max(ready, self.servers[routed.server_id].backlog), ready, None, routed)
        for p in self.options(w, routed) if best is None else ():
            server = self.servers[p.server_id]
            plan = _ready(
                p,
                server,
                self.ready_at,
                self.work,
                self.places,
                self.unload_s,
                w.not_before_s,
                lambda victim, p=p: self.free_at(w, p, victim),
            )
            if plan is None:
                continue
            start = max(plan[0], server.backlog)
            if best is None or start < best[0]:
                best = (start, *plan, p)
        if best is None:
            return
        start, ready, victim, p = best
        server = self.servers[p.server_id]
        run_s = w.run_on(p)
        if w.id in self.kept:
            if self.kept_ahead[p.id].pop(w.id, None) is not None:
                self.kept_work[p.id] -= run_s / server.lanes(p)
        else:
            if p.id not in self.ready_at:
                if victim is not None:
                    self.evict(w, p, victim)
                self.ready_at[p.id] = server.load_free = ready
                server.resident.add(p.id)
            # Rough: its share of the slots it runs in, for an eviction's wait on this model.
            self.work[p.id] = max(self.work[p.id], ready) + run_s / server.lanes(p)
        server.backlog = start + run_s / server.host.slots
        self.run_of[w.id] = run_s
        self.queues[p.server_id].append((rank, w.id, run_s, ready, p.id))
        self.queued[p.id] += 1

    def run(self) -> dict[Hashable, float | None]:
        etas: dict[Hashable, float | None] = dict.fromkeys((w.id for w in self.line), None)
        for rank, w in enumerate(self.line):
            self.place(rank, w)
        for server_id, queue in self.queues.items():
            _send(self.servers[server_id], queue, etas)
        return etas


def _within_caps(
    etas: dict[Hashable, float | None], found: _Forecast, caps: dict[Hashable, Cap]
) -> dict[Hashable, float | None]:
    """`etas`, each no sooner than a unit of each of its caller's quotas frees."""
    if not caps:
        return etas
    frees = {c.id: _free_slots(c.busy_s, c.limit) for c in caps.values() if c.limit > 0}
    sent = sorted((eta, found.rank[w.id], w) for w in found.line if (eta := etas[w.id]) is not None)
    for eta, _, w in sent:
        held = [frees[c] for c in w.caps if c in frees]
        if not held:
            continue
        start = max([eta] + [heap[0] for heap in held])
        etas[w.id] = start
        for heap in held:
            heapq.heapreplace(heap, start + found.run_of[w.id])
    return etas


def _room(p: Place, servers: dict, places: dict) -> bool:
    """Can `p` be loaded without evicting anything?"""
    server = servers[p.server_id]
    same = [v for v in server.resident if places[v].model_type == p.model_type]
    host = server.host
    return len(same) < host.capacity.get(p.model_type, 1) and not host.full(len(server.resident))


def _ready(
    p: Place,
    server: _Server,
    ready_at: dict,
    work: dict,
    places: dict,
    unload_s: float,
    not_before_s: float,
    free_at: Callable[[int], float],
):
    """(ready, victim): when `p` can serve a request held until `not_before_s` (after a
    load if it needs one, begun once the hold ends, evicting the least recently used of its
    type, or of any type where that is the limit, once `free_at` says it may go), or None if
    it cannot."""
    if p.id in ready_at:
        return max(ready_at[p.id], not_before_s), None
    limit = server.host.capacity.get(p.model_type, 1)
    if limit < 1:
        return None  # the server holds no model of this type
    same = [v for v in server.resident if places[v].model_type == p.model_type]
    if len(same) < limit:
        # Room for its type; with none in all (`max_models`), a model of any type goes.
        same = list(server.resident) if server.host.full(len(server.resident)) else []
    victim = None
    begin = max(server.load_free, not_before_s)
    if same:
        victim = min(same, key=lambda v: (work[v], -places[v].idle_s))  # LRU
        begin = max(begin, free_at(victim)) + unload_s
    return begin + p.load_s, victim


def _send(server: _Server, queue: list, etas: dict) -> None:
    """Each time a slot frees, the best ranked request that can start by then goes (queue:
    rank, request, its expected run, when its model is ready there, its place): its model
    ready, and one of the model's own slots free where it has fewer than the server. The
    requests are kept in one line per model and moment of readiness, so a deep line costs a
    pass over it."""
    lines: dict[tuple[float, int], deque] = {}
    for q in sorted(queue):
        lines.setdefault((q[3], q[4]), deque()).append(q)

    def start(key: tuple[float, int]) -> float:
        ready, place = key
        own = server.own.get(place)
        return max(ready, own[0]) if own else ready

    while lines:
        starts = {key: start(key) for key in lines}
        free = max(server.slots[0], min(starts.values()))
        key = min((k for k, t in starts.items() if t <= free), key=lambda k: lines[k][0][0])
        _, request_id, run_s, _, place = lines[key].popleft()
        if not lines[key]:
            del lines[key]
        etas[request_id] = free
        heapq.heapreplace(server.slots, free + run_s)
        if place in server.own:
            heapq.heapreplace(server.own[place], free + run_s)

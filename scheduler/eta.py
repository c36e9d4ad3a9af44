"""The ETA: how many seconds until a waiting request is sent to a server. Pure, like the
policy: the dashboard feeds it the database's picture, the simulation its own.

The forecast plays the line forward in the order given (the policy's order: class, aged,
then arrival): each request goes where it would start first among its model's deployments
(or the one it is routed to), after what is left of a load under way, or after a load of
its own (one at a time per server, evicting the least recently used model of its type when
the server is full, once that model's requests are done), and after a slot frees. A slot
frees when a request's expected run ends. Expected times come from history: a deployment's
moving average of load time and of run time.

How good it is gets measured, not assumed: `Accuracy` counts the share of requests sent
within TOLERANCE of the ETA they were first given (`dashboard/eta_checks.py` live,
`scheduler/simulation.py` on a simulated day)."""

import heapq
import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

TOLERANCE = 0.20
FLOOR_S = 1.0  # an ETA of a second or less is right within a second
# Below this a server's load fraction says too little to scale from (a first tick).
MIN_REPORTED = 0.05
DEFAULT_RUN_S = 5.0  # before any request of any model has run


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

    def run_on(self, p: Place) -> float:
        """Its expected run on `p`."""
        return p.run_s if self.run_s is None else self.run_s


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
    parallel_load_queue: int = 2,
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
    policy does. When: per server, as each slot frees, the best placed
    request whose model is ready by then is sent (a loaded model's requests go ahead of
    those waiting for a load, as the policy sends them)."""
    hosts = {h.id: h for h in hosts if h.available}
    places = {p.id: p for p in places if p.server_id in hosts and p.state != "failed"}
    by_model: dict[Hashable, list[Place]] = {}
    for p in places.values():
        by_model.setdefault(p.model, []).append(p)
    servers = {
        h.id: _Server(h, [p for p in places.values() if p.server_id == h.id])
        for h in hosts.values()
    }
    ready_at = {
        p.id: (0.0 if p.state == "loaded" else p.load_left_s)
        for p in places.values()
        if p.state in ("loaded", "loading")
    }
    work: dict[int, float] = {p.id: max(p.busy_s, default=0.0) for p in places.values()}
    # A request already routed to a model that is there (loaded, or joined to its load) is
    # served there before the model can leave, as the policy serves the requests that
    # waited for a load: its run is counted on the model from the start, so an eviction
    # placed for a request ahead of it waits for it, and it never waits for a reload.
    line = list(line)
    kept: dict[Hashable, float] = {}
    for w in line:
        p = places.get(w.deployment_id) if w.deployment_id is not None else None
        if p is not None and p.id in ready_at:
            kept[w.id] = max(ready_at[p.id], w.not_before_s)
            run_s = w.run_on(p)
            work[p.id] = max(work[p.id], kept[w.id]) + run_s / servers[p.server_id].lanes(p)
    queues: dict[int, list[tuple[int, Hashable, float, float, int]]] = {h: [] for h in servers}
    queued = dict.fromkeys(places, 0)
    etas: dict[Hashable, float | None] = {}
    for rank, w in enumerate(line):
        etas[w.id] = None
        routed = places.get(w.deployment_id) if w.deployment_id is not None else None
        options = [routed] if routed else by_model.get(w.model, [])
        # The policy loads a model elsewhere only when it must, or where there is free room
        # once a queue builds for it: otherwise it waits where the model is.
        resident = [p for p in options if p.id in ready_at]
        if resident and not routed:
            crowded = all(
                queued[p.id] >= parallel_load_queue and servers[p.server_id].backlog > 0
                for p in resident
            )
            loading = any(ready_at[p.id] > 0 for p in resident)
            roomy = [p for p in options if p.id not in ready_at and _room(p, servers, places)]
            options = resident + (roomy if crowded and not loading else [])
        best = None
        if w.id in kept:
            best = (max(kept[w.id], servers[routed.server_id].backlog), kept[w.id], None, routed)
        for p in options if best is None else ():
            server = servers[p.server_id]
            plan = _ready(p, server, ready_at, work, places, unload_s, w.not_before_s)
            if plan is None:
                continue
            start = max(plan[0], server.backlog)
            if best is None or start < best[0]:
                best = (start, *plan, p)
        if best is None:
            continue
        start, ready, victim, p = best
        server = servers[p.server_id]
        run_s = w.run_on(p)
        if w.id not in kept:
            if p.id not in ready_at:
                ready_at[p.id] = server.load_free = ready
                server.resident.add(p.id)
                if victim is not None:
                    server.resident.discard(victim)
                    ready_at.pop(victim, None)
            # Rough: its share of the slots it runs in, for an eviction's wait on this model.
            work[p.id] = max(work[p.id], ready) + run_s / server.lanes(p)
        server.backlog = start + run_s / server.host.slots
        queues[p.server_id].append((rank, w.id, run_s, ready, p.id))
        queued[p.id] += 1
    for server_id, queue in queues.items():
        _send(servers[server_id], queue, etas)
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
    not_before_s: float = 0.0,
):
    """(ready, victim): when `p` can serve a request held until `not_before_s` (after a
    load if it needs one, begun once the hold ends, evicting the least recently used of its
    type, or of any type where that is the limit, once its work is done), or None if it
    cannot."""
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
        begin = max(begin, work[victim]) + unload_s
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


def within(eta_s: float, actual_s: float) -> bool:
    return abs(actual_s - eta_s) <= max(TOLERANCE * eta_s, FLOOR_S)


@dataclass
class Accuracy:
    """Of the requests given an ETA and since sent: how many within tolerance, and the
    median of |error| relative to the ETA."""

    checked: int = 0
    within: int = 0
    errors: list[float] = field(default_factory=list)  # seconds, > 0: later than said

    def add(self, eta_s: float, actual_s: float) -> None:
        self.checked += 1
        self.within += within(eta_s, actual_s)
        self.errors.append(actual_s - eta_s)

    @property
    def share(self) -> float | None:
        return self.within / self.checked if self.checked else None

    @property
    def median_error_s(self) -> float | None:
        if not self.errors:
            return None
        ordered = sorted(abs(e) for e in self.errors)
        return ordered[max(math.ceil(len(ordered) / 2) - 1, 0)]

    def summary(self) -> str:
        if not self.checked:
            return "no ETA checked"
        return (
            f"{self.share:.0%} within ±{TOLERANCE:.0%} (or {FLOOR_S:g} s) of {self.checked}, "
            f"median error {self.median_error_s:.1f} s"
        )

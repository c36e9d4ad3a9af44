"""The self-swapping baseline: what teams run today, a proxy in front of servers that load
models on demand by themselves (Ollama, LM Studio's just-in-time loading, llama-swap).

- The proxy sends each request, as it arrives, to the least busy server that lists its model
  (requests in flight and queued there per slot; the first listed on a tie). It never moves
  it again.
- A server loads whatever arrives: a request for a model it neither holds nor is loading
  starts a load at once, beside other loads, if the model fits (its count of models of that
  type, its memory). To make room it unloads the least recently used idle model (nothing in
  flight, not loading); with none idle, the request waits until one is.
- It serves a request only once its model is loaded, into a free slot, oldest first.
- A request still waiting after its class's max wait is expired, its wait that max wait.

The same virtual clock as the policy's simulation; loads take the model's load time after
the unloads it needed, each unload `trace.unload_s`.
"""

import heapq
import itertools
from dataclasses import dataclass, field

from .simulation import Outcome, Result
from .simulation_workload import ModelSpec, ServerSpec, Workload


@dataclass
class _Held:
    model: ModelSpec
    state: str  # loading, loaded
    in_flight: int = 0
    last_used: float = 0.0


@dataclass
class _Server:
    spec: ServerSpec
    held: dict[str, _Held] = field(default_factory=dict)
    queue: list[int] = field(default_factory=list)  # request indexes, arrival order
    in_flight: int = 0

    def busyness(self) -> float:
        return (self.in_flight + len(self.queue)) / max(self.spec.slots, 1)


def simulate_self_swapping(trace: Workload) -> Result:
    return _Swap(trace).run()


class _Swap:
    def __init__(self, trace: Workload) -> None:
        self.trace = trace
        self.result = Result("self-swap", accepted=len(trace.requests))
        self.models = {m.name: m for m in trace.models}
        self.servers = {s.name: _Server(s) for s in trace.servers}
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.now = 0.0

    def schedule(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, payload))

    def run(self) -> Result:
        for i, r in enumerate(self.trace.requests):
            self.schedule(r.at, "arrive", i)
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            touched = self.happen(kind, payload)
            if touched is not None:
                self.serve(touched)
        return self.result

    def happen(self, kind: str, payload) -> _Server | None:
        if kind == "arrive":
            r = self.trace.requests[payload]
            homes = [self.servers[name] for name in self.models[r.model].servers]
            server = min(homes, key=lambda s: s.busyness())
            server.queue.append(payload)
            self.schedule(r.at + self.trace.max_wait_s[r.priority], "expire", (server, payload))
            return server
        if kind == "expire":
            server, i = payload
            if i in server.queue:
                server.queue.remove(i)
                r = self.trace.requests[i]
                self.result.outcomes[i] = Outcome(
                    r.priority, "expired", self.trace.max_wait_s[r.priority]
                )
            return None
        if kind == "loaded":
            server, name = payload
            held = server.held[name]
            held.state, held.last_used = "loaded", self.now
            self.result.loads += 1
            return server
        if kind == "finished":
            server, name = payload
            held = server.held[name]
            held.in_flight -= 1
            held.last_used = self.now
            server.in_flight -= 1
            return server
        raise ValueError(kind)

    def serve(self, server: _Server) -> None:
        """Start what the server's queue asks for, oldest first: runs into free slots, loads
        of models it does not hold."""
        for i in list(server.queue):
            r = self.trace.requests[i]
            held = server.held.get(r.model)
            if held is None:
                self.start_load(server, self.models[r.model])
            elif held.state == "loaded" and server.in_flight < server.spec.slots:
                server.queue.remove(i)
                server.in_flight += 1
                held.in_flight += 1
                held.last_used = self.now
                self.result.outcomes[i] = Outcome(r.priority, "completed", self.now - r.at)
                self.schedule(self.now + r.duration_s, "finished", (server, r.model))

    def start_load(self, server: _Server, model: ModelSpec) -> None:
        victims = self.room_for(server, model)
        if victims is None:
            return
        for v in victims:
            del server.held[v.model.name]
        done = self.now + len(victims) * self.trace.unload_s + model.load_s
        server.held[model.name] = _Held(model, "loading")
        self.schedule(done, "loaded", (server, model.name))

    def room_for(self, server: _Server, model: ModelSpec) -> list[_Held] | None:
        """The least recently used idle models to unload so that `model` fits, or None."""
        spec = server.spec
        kept = list(server.held.values())
        idle = sorted(
            (h for h in kept if h.state == "loaded" and h.in_flight == 0),
            key=lambda h: h.last_used,
        )
        victims: list[_Held] = []

        def over() -> bool:
            same = sum(1 for h in kept if h.model.type == model.type)
            if same + 1 > spec.capacity.get(model.type, 1):
                return True
            if spec.max_models is not None and len(kept) + 1 > spec.max_models:
                return True
            used = sum(h.model.size_mb or 0 for h in kept) + (model.size_mb or 0)
            return spec.memory_mb is not None and used > spec.memory_mb

        while over():
            if not idle:
                return None
            victims.append(idle.pop(0))
            kept.remove(victims[-1])
        return victims

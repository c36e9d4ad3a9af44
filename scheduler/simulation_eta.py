"""The ETA measured on a simulated day: each request is given the forecast's ETA when it
arrives (before the pass that may route it, as a caller would be told on acceptance), and
the error is counted when it is sent. Expected times come from what the simulation has seen
so far, as the live estimate's come from the database: each deployment's moving average of
load time, each model's mean run time."""

from datetime import datetime
from uuid import UUID

from .eta import (
    Host,
    Place,
    Waiter,
    expected_run_s,
    forecast,
    line_order,
    load_left_s,
)
from .eta_accuracy import Accuracy
from .load_estimate import model_name, with_expected_loads
from .snapshot import DeploymentView, PolicyConfig, RequestView, ServerView, unused_since_loaded

RECENT_WEIGHT = 0.3


class EtaBook:
    def __init__(self, config: PolicyConfig, unload_s: float) -> None:
        self.config = config
        self.unload_s = unload_s
        self.accuracy = Accuracy()
        self.given: dict[UUID, tuple[datetime, float]] = {}
        self.sent_at: dict[UUID, tuple[datetime, int]] = {}  # serving: when, where
        self.load_started: dict[int, datetime] = {}
        self.run_counts: dict[str, int] = {}  # model: requests finished
        self.run_means: dict[str, float] = {}  # model: their mean seconds
        self.class_runs: dict[tuple[str, int], tuple[int, float]] = {}  # (model, class)
        self.priority: dict[UUID, int] = {}

    def class_run_s(self, model: str, priority: int) -> float | None:
        found = self.class_runs.get((model, priority))
        return found[1] if found else None

    def run_s(self, model: str) -> float:
        return expected_run_s(self.run_means, model)

    def give(
        self,
        arrived: list[UUID],
        now: datetime,
        servers: tuple[ServerView, ...],
        deployments: dict[int, DeploymentView],
        waiting: dict[UUID, RequestView],
    ) -> None:
        serving: dict[int, list[float]] = {}
        for at, did in self.sent_at.values():
            left = self.run_s(deployments[did].model) - (now - at).total_seconds()
            serving.setdefault(did, []).append(max(left, 0.0))
        views = with_expected_loads(tuple(deployments.values()), model_name)
        places = [self.place(d, now, tuple(serving.get(d.id, ()))) for d in views]
        hosts = [Host(s.id, s.slots, dict(s.capacity), max_models=s.max_models) for s in servers]
        step = self.config.aging_step_s
        classes = {
            r.id: line_order(r.priority, (now - r.created_at).total_seconds(), step)
            for r in waiting.values()
        }
        line = sorted(waiting.values(), key=lambda r: (classes[r.id], r.created_at, r.id))
        etas = forecast(
            hosts,
            places,
            [
                Waiter(
                    r.id,
                    r.model,
                    r.deployment_id,
                    self.class_run_s(r.model, r.priority),
                    effective_class=classes[r.id],
                )
                for r in line
            ],
            self.unload_s,
            self.config,
        )
        for rid in arrived:
            if etas.get(rid) is not None:
                self.given[rid] = (now, etas[rid])

    def place(self, d: DeploymentView, now: datetime, busy: tuple[float, ...]) -> Place:
        load_s = d.avg_load_s or self.config.default_load_s
        left = 0.0
        if d.state == "loading" and d.id in self.load_started:
            left = load_left_s(load_s, (now - self.load_started[d.id]).total_seconds())
        idle = (now - d.last_used_at).total_seconds() if d.last_used_at else 1e9
        return Place(
            id=d.id,
            server_id=d.server_id,
            model=d.model,
            state=d.state,
            load_s=load_s,
            run_s=self.run_s(d.model),
            model_type=d.model_type,
            load_left_s=left,
            busy_s=busy,
            idle_s=idle,
            fresh=unused_since_loaded(d),
        )

    def sent(self, rid: UUID, did: int, priority: int, now: datetime) -> None:
        self.sent_at[rid] = (now, did)
        self.priority[rid] = priority
        if rid in self.given:
            at, eta = self.given.pop(rid)
            self.accuracy.add(eta, (now - at).total_seconds())

    def finished(self, rid: UUID, model: str, now: datetime) -> None:
        at, _ = self.sent_at.pop(rid)
        took = (now - at).total_seconds()
        n, mean = self.run_counts.get(model, 0), self.run_means.get(model, 0.0)
        self.run_counts[model], self.run_means[model] = n + 1, mean + (took - mean) / (n + 1)
        # Per model and class, a moving average: a burst of short jobs is learned quickly.
        key = (model, self.priority.pop(rid))
        n, mean = self.class_runs.get(key, (0, took))
        self.class_runs[key] = (n + 1, mean + RECENT_WEIGHT * (took - mean))

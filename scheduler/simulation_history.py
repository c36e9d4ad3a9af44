"""A trace of this installation's own traffic: its servers, models and the requests of a
past window, for `manage.py simulate --history HOURS`. An operator replays what really
arrived under other settings (`SWITCHYARD_*`), or beside self-swapping servers, before
changing anything live.

What the rows cannot say is filled in, and `gaps` counts each fill:
- a model's load time is the mean of its deployments' measured loads (`avg_load_s`), else
  of what their operator says (`expected_load_s`) or their size at their server's measured
  speed (else all servers') says (`load_estimate`), else `DEFAULT_LOAD_S`;
- a request's run time is how long it ran (`finished_at - started_at`); one that never ran
  (expired, failed, cancelled, still waiting) takes the median of its model's measured runs
  in the window, else `DEFAULT_RUN_S`;
- a model's size is its largest deployment's `size_mb`, where one is known.
Only enabled servers and deployments count, and requests for a model no longer deployed are
left out. Every server is simulated as one Switchyard loads and unloads models on, the
`openai` kind's too (where it can do neither). Retention (`SWITCHYARD_KEEP_FINISHED_DAYS`)
bounds how far back rows exist.
"""

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from backends.models import Deployment, ModelType, Server

from .api.intake import max_wait_s
from .load_estimate import expected_loads
from .models import Priority, Request
from .simulation_workload import ModelSpec, ServerSpec, Workload, WorkloadRequest

DEFAULT_LOAD_S = 10.0  # as the policy assumes before a load is measured
DEFAULT_RUN_S = 10.0


@dataclass
class History:
    trace: Workload
    gaps: Counter = field(default_factory=Counter)  # what was filled in, and how often
    left_out: int = 0  # requests for models no enabled deployment serves


def trace_from_history(since: datetime, until: datetime) -> History:
    """The servers and models as they are now, and the requests that arrived in
    [since, until), their times counted from `since`."""
    gaps: Counter = Counter()
    deployments = list(
        Deployment.objects.filter(enabled=True, server__enabled=True)
        .select_related("model", "server")
        .order_by("model__name", "server__name")
    )
    servers = tuple(
        _server_spec(s)
        for s in Server.objects.filter(enabled=True, deployments__in=deployments)
        .distinct()
        .order_by("name")
    )
    by_model: dict[str, list[Deployment]] = defaultdict(list)
    for d in deployments:
        by_model[d.model.name].append(d)
    sized = {
        deployments[i].pk: s for i, s in expected_loads(deployments, lambda d: d.model_id).items()
    }
    models = tuple(_model_spec(name, found, sized, gaps) for name, found in by_model.items())

    rows = [
        (created, model, priority, _ran_s(started, finished))
        for created, model, priority, started, finished in Request.objects.filter(
            created_at__gte=since, created_at__lt=until, model__isnull=False
        )
        .order_by("created_at", "id")
        .values_list("created_at", "model__name", "priority", "started_at", "finished_at")
    ]
    ran: dict[str, list[float]] = defaultdict(list)
    for _, model, _, measured in rows:
        if measured is not None:
            ran[model].append(measured)
    requests, left_out = [], 0
    for created, model, priority, measured in rows:
        if model not in by_model:
            left_out += 1
            continue
        if measured is not None:
            duration = measured
        elif ran[model]:
            duration = statistics.median(ran[model])
            gaps["run time: the model's median"] += 1
        else:
            duration = DEFAULT_RUN_S
            gaps["run time: the default"] += 1
        at = (created - since).total_seconds()
        requests.append(WorkloadRequest(round(at, 3), model, priority, round(duration, 3)))
    trace = Workload(
        servers=servers,
        models=models,
        requests=tuple(requests),
        start=since,
        max_wait_s={p.value: max_wait_s(p.value) for p in Priority},
    )
    return History(trace, gaps, left_out)


def _ran_s(started: datetime | None, finished: datetime | None) -> float | None:
    """How long a request ran, if it did."""
    return max((finished - started).total_seconds(), 0.0) if started and finished else None


def _server_spec(s: Server) -> ServerSpec:
    capacity = {
        ModelType.LLM: s.max_llm,
        ModelType.EMBEDDING: s.max_embedding,
        ModelType.RERANKING: s.max_reranking,
    }
    return ServerSpec(
        s.name,
        slots=s.slots,
        memory_mb=s.memory_mb,
        capacity={str(kind): n for kind, n in capacity.items()},
        max_models=s.max_models,
    )


ESTIMATED_LOAD = "load time: its operator's figure or its size at its servers' speed"


def _model_spec(
    name: str, found: list[Deployment], sized: dict[int, float], gaps: Counter
) -> ModelSpec:
    """`sized`: a deployment's expected first load, where `load_estimate` has a basis."""
    load_s = [d.avg_load_s for d in found if d.avg_load_s is not None]
    if not load_s:
        load_s = [sized[d.pk] for d in found if d.pk in sized]
        gaps[ESTIMATED_LOAD if load_s else "load time: the default"] += 1
    sizes = [d.size_mb for d in found if d.size_mb]
    return ModelSpec(
        name,
        round(statistics.fmean(load_s), 3) if load_s else DEFAULT_LOAD_S,
        tuple(d.server.name for d in found),
        type=str(found[0].model.type),
        size_mb=max(sizes) if sizes else None,
    )

"""Snapshot builders for pure policy tests: no database, no clock."""

import uuid
from datetime import UTC, datetime, timedelta

from scheduler.decisions import Defer, Route, StartLoad
from scheduler.snapshot import DeploymentView, PolicyConfig, RequestView, ServerView, Snapshot

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
INTERACTIVE, HIGH, NORMAL, BACKGROUND = 0, 1, 2, 3


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def server(id: int, slots: int = 1, llm: int = 1, **fields) -> ServerView:
    capacity = {"llm": llm, "embedding": fields.pop("embedding", 1), "reranking": 1}
    return ServerView(id=id, name=f"s{id}", slots=slots, capacity=capacity, **fields)


def dep(id: int, server_id: int, model: str, state: str = "unloaded", **fields) -> DeploymentView:
    if state == "loaded":
        fields.setdefault("loaded_at", at(-3600))
        fields.setdefault("last_used_at", at(-600))
    return DeploymentView(id=id, server_id=server_id, model=model, state=state, **fields)


def req(
    model: str,
    priority: int = NORMAL,
    age_s: float = 0,
    state: str = "pending",
    deployment_id: int | None = None,
    **fields,
) -> RequestView:
    created = at(-age_s)
    return RequestView(
        id=fields.pop("id", uuid.uuid4()),
        model=model,
        priority=priority,
        state=state,
        created_at=created,
        expires_at=fields.pop("expires_at", created + timedelta(hours=2)),
        deployment_id=deployment_id,
        **fields,
    )


def snap(servers, deployments, requests, **config) -> Snapshot:
    return Snapshot(tuple(servers), tuple(deployments), tuple(requests), PolicyConfig(**config))


def kinds(decisions) -> list[str]:
    return [type(d).__name__ for d in decisions]


def of(decisions, cls) -> list:
    return [d for d in decisions if isinstance(d, cls)]


def loads(decisions) -> list[tuple[int, tuple[int, ...]]]:
    """Each load started: (deployment, the deployments it evicts)."""
    return [(d.deployment_id, d.evict) for d in of(decisions, StartLoad)]


def routed(decisions) -> dict:
    """Request → the deployment it was routed to."""
    return {d.request_id: d.deployment_id for d in of(decisions, Route)}


def defer(decisions) -> Defer | None:
    found = of(decisions, Defer)
    return found[0] if found else None

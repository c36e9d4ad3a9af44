"""Rows on the bench database: servers, models, deployments, backlogs, and reading back
the timestamps the runtime stamped on each request."""

import time
import uuid
from datetime import timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from backends.models import Deployment, DeploymentState, Model, Server
from scheduler.models import Priority, Request, State

from .results import ok_results
from .stack import BENCH, wait_until


def add_model(name: str, type: str = "llm") -> Model:
    return Model.objects.using(BENCH).create(name=name, type=type)


def add_server(name: str, kind: str = "simulated", **fields: Any) -> Server:
    return Server.objects.using(BENCH).create(name=name, kind=kind, health="up", **fields)


def deploy(server: Server, model: Model, preload: bool = False, **load_options: Any) -> int:
    size_mb = load_options.pop("size_mb", None)
    return (
        Deployment.objects.using(BENCH)
        .create(
            server=server,
            model=model,
            server_model_id=model.name,
            preload=preload,
            size_mb=size_mb,
            load_options=load_options,
        )
        .pk
    )


def wait_loaded(*deployment_ids: int, timeout_s: float = 60) -> None:
    def loaded() -> bool:
        states = Deployment.objects.using(BENCH).filter(pk__in=deployment_ids)
        return states.filter(state=DeploymentState.LOADED).count() == len(deployment_ids)

    wait_until(loaded, timeout_s, f"deployments {deployment_ids} to load")


def backlog(
    model: Model,
    count: int,
    priority: int = Priority.BACKGROUND,
    tokens: int = 8,
    api_key_id: int | None = None,
) -> None:
    """Insert `count` pending requests straight into the table, oldest first (sent with the
    API key `api_key_id`, if given)."""
    now = timezone.now()
    rows = [
        Request(
            id=uuid.uuid4(),
            kind="chat",
            model_name=model.name,
            model=model,
            payload={
                "model": model.name,
                "messages": [{"role": "user", "content": "backlog"}],
                "max_tokens": tokens,
            },
            priority=priority,
            state=State.PENDING,
            api_key_id=api_key_id,
            created_at=now - timedelta(microseconds=count - i),
            expires_at=now + timedelta(days=1),
        )
        for i in range(count)
    ]
    Request.objects.using(BENCH).bulk_create(rows, batch_size=2000)
    # A queue that grew over time has fresh planner statistics (autovacuum sees to that on
    # PostgreSQL); one that appeared in a second has not, and would be planned as empty.
    with connections[BENCH].cursor() as cursor:
        cursor.execute("ANALYZE scheduler_request")


def nudge_workers(postgres: bool) -> None:
    """Rows inserted behind the API's back: wake the workers as the API would (PostgreSQL);
    the embedded worker finds them on its next poll."""
    if postgres:
        with connections[BENCH].cursor() as cursor:
            cursor.execute("SELECT pg_notify('switchyard', '')")


PG_COUNTERS = ("xact_commit", "tup_returned", "tup_fetched", "tup_inserted", "tup_updated")


def pg_counters() -> dict[str, int]:
    """PostgreSQL's own counters for the bench database (flushed when backends exit)."""
    with connections[BENCH].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            f"SELECT {', '.join(PG_COUNTERS)} FROM pg_stat_database WHERE datname = "
            "current_database()"
        )
        return dict(zip(PG_COUNTERS, cursor.fetchone(), strict=True))


def timestamps(ids: list[str]) -> dict[str, dict[str, Any]]:
    """created/routed/started/finished (epoch seconds), state and priority per request id."""
    fields = ("id", "created_at", "routed_at", "started_at", "finished_at", "state", "priority")
    out = {}
    for chunk in range(0, len(ids), 500):
        batch = [uuid.UUID(i) for i in ids[chunk : chunk + 500] if i]
        for row in Request.objects.using(BENCH).filter(pk__in=batch).values_list(*fields):
            out[str(row[0])] = {
                name: (value.timestamp() if hasattr(value, "timestamp") else value)
                for name, value in zip(fields[1:], row[1:], strict=True)
            }
    return out


def via_timestamps(measured: list[dict]) -> list[dict[str, dict[str, Any]]]:
    """`timestamps` of the calls that succeeded, for each run through Switchyard (a paired
    run's second phase; `results.paired`)."""
    return [timestamps([r["id"] for r in ok_results(m["results"])]) for m in measured[1::2]]


def handoffs() -> list[float]:
    """Seconds from each request's end to the next request's send, in the order they were
    sent: with one slot, how long it stood idle between two requests."""
    sent = (
        Request.objects.using(BENCH)
        .filter(started_at__isnull=False)
        .order_by("started_at")
        .values_list("started_at", "finished_at")
    )
    gaps, ended = [], None
    for started_at, finished_at in sent:
        if ended is not None:
            gaps.append((started_at - ended).total_seconds())
        ended = finished_at
    return gaps


def count_in(states: tuple[str, ...], **filters: Any) -> int:
    return Request.objects.using(BENCH).filter(state__in=states, **filters).count()


def wait_processing(timeout_s: float = 30) -> None:
    wait_until(lambda: count_in((State.PROCESSING, State.COMPLETED)) > 0, timeout_s, "a dispatch")


def settle(seconds: float) -> None:
    """Give the worker a moment to plan over rows inserted behind its back."""
    time.sleep(seconds)

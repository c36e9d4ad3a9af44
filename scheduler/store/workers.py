"""Worker leases: registering, heartbeats, and taking back what a worker held."""

import logging
import os
import socket
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from backends.models import Deployment, DeploymentState

from ..models import Request, State, Worker
from ..transitions import Transition, move_all

log = logging.getLogger(__name__)
DS = DeploymentState


def register_worker() -> int:
    return Worker.objects.create(host=socket.gethostname(), pid=os.getpid()).pk


def heartbeat(worker_id: int) -> bool:
    return Worker.objects.filter(pk=worker_id).update(last_heartbeat=timezone.now()) == 1


def take_over_stale_workers(stale_s: float, me: int | None = None) -> tuple[int, list[int]]:
    """Take back what workers with a stale heartbeat held, and what no worker holds.

    Requests they were processing go back to pending (they run again). Returns how many
    requests moved and the deployments whose load or unload was under way, to be
    re-checked with their servers."""
    cutoff = timezone.now() - timedelta(seconds=stale_s)
    stale = list(
        Worker.objects.filter(last_heartbeat__lt=cutoff).exclude(pk=me).values_list("pk", flat=True)
    )
    if stale:
        log.warning("taking over the work of stale workers %s", stale)
    elif not _orphans().exists():
        return 0, orphaned_deployments()
    return _hand_back(stale, "its worker stopped heartbeating; it will run again")


def release_worker(worker_id: int) -> tuple[int, list[int]]:
    """A worker stopping cleanly hands back what it holds, like a stale one."""
    return _hand_back([worker_id], "its worker stopped; it will run again")


def _orphans():
    return Request.objects.filter(state=State.PROCESSING, worker__isnull=True)


def _hand_back(worker_ids: list[int], reason: str) -> tuple[int, list[int]]:
    """Delete these workers, move the requests no worker holds back to pending and recount
    every deployment's in-flight count, in one transaction: a database fault part-way
    leaves all of it to be done again, never a request moved under a stale count."""
    back = {"deployment": None, "server": None}
    with transaction.atomic():
        _lock_deployments()
        Worker.objects.filter(pk__in=worker_ids).delete()
        moved = sum(
            move_all(
                [
                    Transition(
                        request_id, (State.PROCESSING,), State.PENDING, reason, back, server or ""
                    )
                    for request_id, server in _orphans().values_list("pk", "server__name")
                ]
            )
        )
        recount_in_flight()
    return moved, orphaned_deployments()


def _lock_deployments() -> None:
    """Every deployment locked in id order, as a dispatch locks them (the lock order),
    before any request is written; an UPDATE alone would lock them in the table's order."""
    list(Deployment.objects.order_by("pk").select_for_update().values_list("pk", flat=True))


def recount_in_flight() -> None:
    """Set every deployment's in-flight count from the requests processing there, in one
    statement so that a concurrent dispatch is never overwritten."""
    processing = (
        Request.objects.filter(deployment=OuterRef("pk"), state=State.PROCESSING)
        .order_by()
        .values("deployment")
        .annotate(n=Count("pk"))
        .values("n")
    )
    with transaction.atomic():
        _lock_deployments()
        Deployment.objects.update(in_flight=Coalesce(Subquery(processing), 0))


def orphaned_deployments() -> list[int]:
    """Loads or unloads under way that no live worker holds (e.g. after a crash)."""
    return list(
        Deployment.objects.filter(
            state__in=(DS.LOADING, DS.UNLOADING), worker__isnull=True
        ).values_list("pk", flat=True)
    )

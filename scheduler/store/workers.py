"""Worker leases: registering, heartbeats, and taking back what a worker held."""

import logging
import os
import socket
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from backends.models import Deployment, DeploymentState, Server

from .. import channel_hints
from ..models import Request, State, Worker
from ..transitions import Transition, move_all

log = logging.getLogger(__name__)
DS = DeploymentState


def this_machine() -> str:
    """The kernel's boot id and this process's PID namespace: workers that share them see
    the same processes, so one can tell whether another's pid still runs. Empty where
    /proc does not say (not Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


MACHINE = this_machine()


def register_worker() -> int:
    return Worker.objects.create(host=socket.gethostname(), pid=os.getpid(), machine=MACHINE).pk


def exited(pid: int) -> bool:
    """No process has this pid here. (A pid reused since reads as alive: that worker is then
    taken over only once its heartbeat is stale.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it exists
        return False
    return False


def heartbeat(worker_id: int) -> bool:
    return Worker.objects.filter(pk=worker_id).update(last_heartbeat=timezone.now()) == 1


def workers_beside_simulated(me: int) -> tuple[int, list[str]] | None:
    """The other live workers and the enabled simulated servers, if there are both."""
    simulated = list(
        Server.objects.filter(kind="simulated", enabled=True).values_list("name", flat=True)
    )
    if not simulated:
        return None
    others = Worker.objects.live().exclude(pk=me).count()
    return (others, simulated) if others else None


def passes_failing(worker_id: int, since: datetime | None, error: str = "") -> None:
    """Whether the worker's passes fail (since when, and the last error), or no longer."""
    Worker.objects.filter(pk=worker_id).update(failing_since=since, failing_error=error)
    channel_hints.dashboard_changed()  # its banner


def take_over_stale_workers(stale_s: float, me: int | None = None) -> tuple[int, list[int]]:
    """Take back what dead workers held, and what no worker holds: a worker is dead when its
    heartbeat is stale, or at once when it ran on this machine and its process has exited
    (killed, crashed): no wait for the stale time.

    Requests they were processing go back to pending (they run again). Returns how many
    requests moved and the deployments whose load or unload was under way, to be
    re-checked with their servers."""
    cutoff = timezone.now() - timedelta(seconds=stale_s)
    gone, stale = [], []
    for pk, beat, machine, pid in Worker.objects.exclude(pk=me).values_list(
        "pk", "last_heartbeat", "machine", "pid"
    ):
        if MACHINE and machine == MACHINE and exited(pid):
            gone.append(pk)
        elif beat < cutoff:
            stale.append(pk)
    if gone:
        log.warning("taking over the work of workers %s: their processes have exited", gone)
    if stale:
        log.warning("taking over the work of stale workers %s", stale)
    if not gone and not stale and not _orphans().exists():
        return 0, orphaned_deployments()
    reason = (
        "its worker's process exited; it will run again"
        if gone and not stale
        else "its worker stopped heartbeating; it will run again"
    )
    return _hand_back(gone + stale, reason)


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
    list(
        Deployment.objects.order_by("pk")
        .select_for_update(no_key=True)
        .values_list("pk", flat=True)
    )


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

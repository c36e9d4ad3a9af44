"""Loads and unloads of deployments: claiming one, its progress, its end."""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backends.adapters.base import AdapterError, ErrorCode, LoadTarget
from backends.models import Deployment, DeploymentState, LoadCause, ModelType, Server

from .. import channel_hints
from ..models import INTENT_OPEN, WAITING_STATES, Intent, MetricEvent, Request
from ..retry import backoff_s
from .knobs import knob

log = logging.getLogger(__name__)
DS = DeploymentState


@dataclass(frozen=True)
class LoadJob:
    deployment_id: int
    server_id: int
    server_name: str
    model_name: str
    worker_id: int
    target: LoadTarget
    evict: tuple[tuple[int, str], ...]  # (deployment id, server model id)
    learn_facts: bool = False  # its slots, capabilities or context: nobody has said them yet


def this_loads_options(deployment_id: int) -> dict:
    """The options of the oldest open load intent for the deployment ({} if none): the load
    starting now is the one it asked for (scheduler.intents marks it running on seeing it)."""
    asked = (
        Intent.objects.filter(
            deployment_id=deployment_id,
            action=Intent.Action.LOAD,
            status__in=INTENT_OPEN,
        )
        .order_by("created_at", "id")
        .values_list("options", flat=True)
        .first()
    )
    return asked or {}


def start_load(
    deployment_id: int, evict: tuple[int, ...], worker_id: int, reason: str, cause: str = "request"
):
    now = timezone.now()
    server_id = server_of_deployment(deployment_id)
    if server_id is None:  # deleted since the pass read it
        return None
    with transaction.atomic():
        # Lock the server row: two workers never start loads on the same server at once.
        Server.objects.select_for_update(no_key=True).filter(pk=server_id).first()
        busy = Deployment.objects.filter(
            server_id=server_id, state__in=(DS.LOADING, DS.UNLOADING)
        ).exists()
        if busy:
            return None
        claimed = Deployment.objects.filter(
            pk=deployment_id, state__in=(DS.UNLOADED, DS.FAILED)
        ).update(
            state=DS.LOADING,
            state_changed_at=now,
            load_started_at=now,
            load_progress=0.0,
            worker_id=worker_id,
            last_used_at=now,
            displaced=False,
            load_cause=cause,
        )
        if not claimed:
            return None
        for victim in evict:
            if not Deployment.objects.filter(pk=victim, state=DS.LOADED, in_flight=0).update(
                state=DS.UNLOADING, state_changed_at=now, worker_id=worker_id, load_progress=None
            ):
                transaction.set_rollback(True)
                return None
        # The options of an operator's load intent for it apply to this load only (they are
        # kept on the intent and here, never merged into the deployment's own).
        asked = this_loads_options(deployment_id)
        Deployment.objects.filter(pk=deployment_id).update(load_overrides=asked)
        d = Deployment.objects.select_related("model", "server").get(pk=deployment_id)
        leaving = Deployment.objects.filter(pk__in=evict).order_by("pk")
        rows = tuple(leaving.values_list("pk", "server_model_id", "model__name"))
        victims = tuple((pk, server_model_id) for pk, server_model_id, _ in rows)
        victim_names = ", ".join(name for _, _, name in rows)
        if cause == LoadCause.RESTORE:
            MetricEvent.record(MetricEvent.Kind.RESTORE, d.server.name, d.model.name)
    transaction.on_commit(channel_hints.dashboard_changed)
    log.info(
        "loading %s on %s (%s)%s",
        d.model.name,
        d.server.name,
        reason,
        f", evicting {victim_names}" if victims else "",
    )
    return LoadJob(
        deployment_id=d.pk,
        server_id=d.server_id,
        server_name=d.server.name,
        model_name=d.model.name,
        worker_id=worker_id,
        target=LoadTarget(
            d.server_model_id,
            d.model.type,
            d.effective_load_options(),
            float(d.model.load_timeout_s),
        ),
        evict=victims,
        learn_facts=facts_unknown(d),
    )


def facts_unknown(d: Deployment) -> bool:
    """Whether nobody has said what its server can tell once the model runs: its slots, its
    model's context or (an LLM's) capabilities."""
    return (
        d.slots is None
        or d.model.context_length is None
        or (d.model.type == ModelType.LLM and d.model.capabilities is None)
    )


def evicted(deployment_id: int, to_make_room: bool = False) -> None:
    if to_make_room:
        found = Deployment.objects.select_related("server", "model").filter(pk=deployment_id)
        if (d := found.first()) is not None:  # None: deleted meanwhile
            MetricEvent.record(MetricEvent.Kind.EVICTION, d.server.name, d.model.name)
    Deployment.objects.filter(pk=deployment_id).update(
        state=DS.UNLOADED,
        state_changed_at=timezone.now(),
        worker=None,
        loaded_at=None,
        load_progress=None,
        displaced=to_make_room,
    )
    channel_hints.dashboard_changed()


def unload_called_off(deployment_id: int) -> None:
    """`unloading` → `loaded` again, used now: its server was running requests on it that
    Switchyard did not send (an idle TTL's unload, `Unload.if_unused`)."""
    now = timezone.now()
    Deployment.objects.filter(pk=deployment_id, state=DS.UNLOADING).update(
        state=DS.LOADED, state_changed_at=now, worker=None, last_used_at=now
    )
    channel_hints.dashboard_changed()


def load_wanted(deployment_id: int) -> bool:
    """Whether the load under way is still wanted: a request waits for it (or for its model
    and is not routed yet), or an operator, a preload or a restore asked for it."""
    found = Deployment.objects.filter(pk=deployment_id).values_list("load_cause", "model_id")
    if (row := found.first()) is None:  # deleted meanwhile
        return False
    cause, model_id = row
    if cause != LoadCause.REQUEST:
        return True
    routed_here = Q(deployment_id=deployment_id)
    not_routed = Q(model_id=model_id, deployment__isnull=True)
    return Request.objects.filter(routed_here | not_routed, state__in=WAITING_STATES).exists()


def load_called_off(job: LoadJob) -> None:
    """Nobody waits for `job`'s load any more, before it began (it waited for requests that
    Switchyard did not send to finish on a victim): the victims not yet unloaded are
    `loaded` again, and the deployment `unloaded`, as before the load."""
    now = timezone.now()
    ours = Deployment.objects.filter(worker=job.worker_id)  # not taken over meanwhile
    with transaction.atomic():
        kept = [victim for victim, _ in job.evict]
        ours.filter(pk__in=kept, state=DS.UNLOADING).update(
            state=DS.LOADED, state_changed_at=now, worker=None
        )
        ours.filter(pk=job.deployment_id, state=DS.LOADING).update(
            state=DS.UNLOADED, state_changed_at=now, worker=None, load_progress=None
        )
    channel_hints.dashboard_changed()


def start_unload(deployment_id: int, worker_id: int) -> tuple[int, str] | None:
    if not Deployment.objects.filter(pk=deployment_id, state=DS.LOADED, in_flight=0).update(
        state=DS.UNLOADING,
        state_changed_at=timezone.now(),
        worker_id=worker_id,
        load_progress=None,
    ):
        return None
    # None if deleted meanwhile: nothing to unload for.
    return (
        Deployment.objects.filter(pk=deployment_id)
        .values_list("server_id", "server_model_id")
        .first()
    )


@dataclass(frozen=True)
class StopJob:
    """A load under way that this worker stops (`stop_load`)."""

    deployment_id: int
    server_id: int
    server_name: str
    model_name: str
    server_model_id: str


def stop_load(deployment_id: int, worker_id: int) -> StopJob | None:
    """`loading` → `unloading`, only if this worker holds that load (its task is ours to
    cancel); None if the load ended meanwhile, or is another worker's. Its end, should it
    finish all the same, then finds the row `unloading` and leaves it so
    (`load_succeeded`, `load_failed`)."""
    if not Deployment.objects.filter(
        pk=deployment_id, state=DS.LOADING, worker_id=worker_id
    ).update(state=DS.UNLOADING, state_changed_at=timezone.now(), load_progress=None):
        return None
    d = Deployment.objects.select_related("model", "server").filter(pk=deployment_id).first()
    if d is None:  # deleted meanwhile: its load goes with it
        return None
    MetricEvent.record(MetricEvent.Kind.LOAD_STOPPED, d.server.name, d.model.name)
    channel_hints.dashboard_changed()
    return StopJob(d.pk, d.server_id, d.server.name, d.model.name, d.server_model_id)


def server_of_deployment(deployment_id: int) -> int | None:
    """None once the deployment is deleted."""
    return Deployment.objects.values_list("server_id", flat=True).filter(pk=deployment_id).first()


def set_load_progress(deployment_id: int, fraction: float) -> None:
    Deployment.objects.filter(pk=deployment_id, state=DS.LOADING).update(load_progress=fraction)
    channel_hints.dashboard_changed()


def load_succeeded(job: LoadJob, seconds: float) -> None:
    now = timezone.now()
    d = gone_meanwhile(job, "loaded")
    if d is None:
        return
    avg = seconds if d.avg_load_s is None else 0.7 * d.avg_load_s + 0.3 * seconds
    mine = Deployment.objects.filter(pk=job.deployment_id, state=DS.LOADING, worker=job.worker_id)
    loaded = mine.update(
        state=DS.LOADED,
        state_changed_at=now,
        loaded_at=now,
        last_used_at=now,
        load_progress=1.0,
        avg_load_s=avg,
        load_failures=0,
        next_load_at=None,
        last_error="",
        last_error_code="",
        worker=None,
    )
    if loaded:
        MetricEvent.record(MetricEvent.Kind.LOAD, d.server.name, d.model.name, seconds)
        log.info("loaded %s in %s", d, took(seconds))
    else:  # stopped meanwhile (`stop_load`), or taken over: its row is not ours to move
        log.info("loaded %s in %s, but that load was no longer ours", d, took(seconds))
    channel_hints.dashboard_changed()


def load_failed(job: LoadJob, error: AdapterError) -> None:
    """Back off and retry, or give up: `failed` when attempts are spent or it is not found.
    A server that is busy (full for now) is asked again however often it says so."""
    d = gone_meanwhile(job, "failed to load")
    if d is None:
        return
    failures = d.load_failures + 1
    spent = failures >= knob("LOAD_ATTEMPTS") and error.code != ErrorCode.BUSY
    permanent = error.code == ErrorCode.NOT_FOUND or spent
    delay = backoff_s(failures, knob("RETRY_BASE_S"), knob("RETRY_MAX_S"))
    failed = Deployment.objects.filter(pk=job.deployment_id, state=DS.LOADING, worker=job.worker_id)
    if failed.update(
        state=DS.FAILED if permanent else DS.UNLOADED,
        state_changed_at=timezone.now(),
        load_failures=0 if permanent else failures,
        next_load_at=None if permanent else timezone.now() + timedelta(seconds=delay),
        last_error=error.message[:2000],
        last_error_code=error.code
        if error.code == ErrorCode.NOT_FOUND
        else ("load_failed" if permanent else error.code),
        load_progress=None,
        worker=None,
    ):
        MetricEvent.record(MetricEvent.Kind.LOAD_FAILED, d.server.name, d.model.name)
    log.warning(
        "loading %s failed (%s): %s%s",
        d,
        error.code,
        error.message,
        "; giving up" if permanent else f"; retrying in {delay:.0f} s",
    )
    channel_hints.dashboard_changed()


def gone_meanwhile(job: LoadJob, ended: str) -> Deployment | None:
    """The deployment of a load that has ended, or None (said in the log) if an operator
    deleted it meanwhile (the admin, `apply_config --prune`)."""
    d = Deployment.objects.select_related("server", "model").filter(pk=job.deployment_id).first()
    if d is None:
        log.info(
            "%s %s on %s, whose deployment was deleted meanwhile",
            job.model_name,
            ended,
            job.server_name,
        )
    return d


def took(seconds: float) -> str:
    """A load's time for the log: a small model's loads take milliseconds."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"

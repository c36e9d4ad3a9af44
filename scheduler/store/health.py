"""Server health: successes, failures and the breaker, probes and status sync."""

import logging
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db.models import F, Q
from django.utils import timezone

from backends.adapters.base import AdapterError, ServerModel
from backends.models import (
    Deployment,
    DeploymentState,
    Health,
    LoadCause,
    Server,
    available_again,
    unavailable_from,
)

from .. import channel_hints
from ..models import MetricEvent
from ..retry import backoff_s
from .knobs import knob
from .loads import facts_unknown

log = logging.getLogger(__name__)
DS = DeploymentState


def server_succeeded(server_id: int) -> None:
    """Healthy again, seen now. `last_seen` is refreshed at most once a second, so that busy
    servers' rows are not rewritten (and locked) on every completion."""
    now = timezone.now()
    Server.objects.filter(pk=server_id).filter(
        ~Q(health=Health.UP)
        | ~Q(consecutive_failures=0)
        | Q(last_seen__isnull=True)
        | Q(last_seen__lt=now - timedelta(seconds=1))
    ).update(
        health=Health.UP,
        consecutive_failures=0,
        cooldown_until=None,
        last_error="",
        last_seen=now,
        unavailable_since=available_again("health"),
    )


def server_failed(server_id: int, message: str) -> None:
    """Count a failure; the breaker opens after BREAKER_FAILURES in a row. In cooldown only
    a failed probe counts (`probe_result`): the calls under way when the breaker opened fail
    too, and counted they would make the next cooldown the longest at once."""
    failing = Server.objects.filter(pk=server_id)
    failing.update(last_error=message[:2000])
    failing.exclude(health=Health.COOLDOWN).update(
        consecutive_failures=F("consecutive_failures") + 1
    )
    server = Server.objects.filter(pk=server_id).first()
    if server is None:  # deleted meanwhile
        return
    if server.consecutive_failures >= knob("BREAKER_FAILURES") and server.health != Health.COOLDOWN:
        open_breaker(server, f"{server.consecutive_failures} failures in a row: {message}")


def open_breaker(server: Server, reason: str) -> None:
    """Cooldown: no work is sent there until a probe answers at its end. Cooldowns in a row
    (each failed probe starts another) grow from RETRY_BASE_S, doubling, to
    BREAKER_COOLDOWN_S: a server restarted in seconds is back in seconds (a first cooldown
    of a minute failed every request waiting for it past the no-server grace), and one that
    stays down is asked once a minute."""
    now = timezone.now()
    in_a_row = server.consecutive_failures - knob("BREAKER_FAILURES") + 1
    cooldown_s = backoff_s(in_a_row, knob("RETRY_BASE_S"), knob("BREAKER_COOLDOWN_S"))
    until = now + timedelta(seconds=cooldown_s)
    Server.objects.filter(pk=server.pk).update(
        health=Health.COOLDOWN, cooldown_until=until, unavailable_since=unavailable_from(now)
    )
    if server.health != Health.COOLDOWN:  # a failed probe in cooldown extends it: no new trip
        MetricEvent.record(MetricEvent.Kind.BREAKER_TRIP, server.name)
    log.warning("server %s in cooldown until %s: %s", server.name, until.isoformat(), reason)
    channel_hints.dashboard_changed()


def probe_result(server_id: int, error: AdapterError | None) -> None:
    server = Server.objects.filter(pk=server_id).first()
    if server is None:  # deleted meanwhile
        return
    if error is None:
        Server.objects.filter(pk=server_id).update(
            health=Health.UP,
            consecutive_failures=0,
            cooldown_until=None,
            last_seen=timezone.now(),
            last_error="",
            unavailable_since=available_again("health"),
        )
        log.info("server %s answered its probe: healthy again", server.name)
        channel_hints.dashboard_changed()
    else:
        Server.objects.filter(pk=server_id).update(
            consecutive_failures=F("consecutive_failures") + 1
        )
        server.refresh_from_db()
        open_breaker(server, f"probe failed: {error.message}")


def server_name(server_id: int) -> str:
    """For a log line an operator reads: the name they gave the server, not its row id."""
    name = Server.objects.filter(pk=server_id).values_list("name", flat=True).first()
    return name or f"#{server_id}"


def mark_down(server_id: int, message: str) -> None:
    changed = Server.objects.filter(pk=server_id).exclude(health__in=(Health.DOWN, Health.COOLDOWN))
    down = {"unavailable_since": unavailable_from(timezone.now())}
    if changed.update(health=Health.DOWN, last_error=message[:2000], **down):
        log.warning("server %s is down: %s", server_name(server_id), message)
        channel_hints.dashboard_changed()


def learn_room(server_id: int, room: int) -> str | None:
    """The server runs at most `room` models at once (a router's `--models-max`): its
    `max_models` becomes that where it was empty or larger (one an operator set lower
    stays). What changed, as the log says it; None when nothing did."""
    server = Server.objects.filter(pk=server_id).first()
    if server is None or (server.max_models is not None and server.max_models <= room):
        return None
    was = "empty" if server.max_models is None else str(server.max_models)
    larger = Q(max_models__isnull=True) | Q(max_models__gt=room)
    if not Server.objects.filter(larger, pk=server_id).update(max_models=room):
        return None
    return (
        f"server {server.name} runs at most {room} model{'' if room == 1 else 's'} at once"
        f" (--models-max): Switchyard now keeps at most {room} there in all (max models in"
        f" all, was {was})"
    )


class Synced(NamedTuple):
    changes: list[str]
    """What changed, as the log says it."""
    to_learn: list[tuple[int, str]]
    """The deployments found loaded outside Switchyard whose facts nobody has said (their
    ids and model names there): the worker asks their server, as after a load of its own."""
    loaded: list[tuple[int, str, datetime | None]]
    """The deployments with an idle TTL loaded there, as the server says and we knew before
    it was asked (ids, model names there, when loaded): the worker may ask what the server
    ran on them. Only those: asking llama-server keeps it from its own idle sleep."""


def apply_server_models(server_id: int, listed: list[ServerModel], asked_at: datetime) -> Synced:
    """Correct deployment states from what the server reported when asked at `asked_at`. A
    deployment whose state changed after the question (a load that finished meanwhile) is
    left alone: the answer is older than what we know."""
    now = timezone.now()
    was_down = Server.objects.filter(pk=server_id, health=Health.DOWN).exists()
    Server.objects.filter(pk=server_id).exclude(health=Health.COOLDOWN).update(
        health=Health.UP, last_seen=now, last_error="", unavailable_since=available_again("health")
    )
    loaded = {m.id for m in listed if m.state == "loaded"}
    changes, to_learn, still = [], [], []
    settled = Deployment.objects.select_related("model").filter(
        server_id=server_id, state__in=(DS.LOADED, DS.UNLOADED), state_changed_at__lt=asked_at
    )
    for d in settled:
        if d.state == DS.LOADED and d.server_model_id not in loaded and d.in_flight == 0:
            Deployment.objects.filter(pk=d.pk, state=DS.LOADED, in_flight=0).update(
                state=DS.UNLOADED, state_changed_at=now, loaded_at=None, load_progress=None
            )
            changes.append(f"{d.server_model_id} was unloaded outside Switchyard")
        elif d.state == DS.LOADED and d.server_model_id in loaded:
            if d.idle_ttl_s is not None:
                still.append((d.pk, d.server_model_id, d.loaded_at))
        elif d.state == DS.UNLOADED and d.server_model_id in loaded:
            Deployment.objects.filter(pk=d.pk, state=DS.UNLOADED).update(
                state=DS.LOADED,
                state_changed_at=now,
                loaded_at=now,
                last_used_at=now,
                load_overrides={},  # not a load an operator asked for
                displaced=False,
                load_cause="outside",
                load_progress=1.0,  # as a load of ours that finished
            )
            changes.append(f"{d.server_model_id} was loaded outside Switchyard")
            if facts_unknown(d):
                to_learn.append((d.pk, d.server_model_id))
    if said := ["back up"] * was_down + changes:
        log.info("status sync of server %s: %s", server_name(server_id), "; ".join(said))
        channel_hints.dashboard_changed()
    return Synced(changes, to_learn, still)


def seen_used(deployment_ids: list[int], at: datetime) -> None:
    """The server ran requests on these loaded models since it was last asked (others',
    or ours): each counts as used `at` (its idle TTL starts again, and it is the last of
    its server's to be evicted). Not one of our loads that no request of ours has used
    yet: the policy keeps it for the requests that waited for it (no wasted load)."""
    fresh = Q(loaded_at__isnull=False, last_used_at__lte=F("loaded_at")) & ~Q(
        load_cause=LoadCause.OUTSIDE
    )
    Deployment.objects.filter(pk__in=deployment_ids, state=DS.LOADED).exclude(fresh).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=at)
    ).update(last_used_at=at)


def recheck_deployment(
    deployment_id: int, listed: list[ServerModel] | None, held_by: int | None = None
) -> None:
    """A load or unload that nobody finished (its worker died or it failed halfway): trust
    what the server says now. Only while it is still under way and held by `held_by` (no
    worker: an orphan), so that a load another worker started meanwhile is left alone."""
    d = Deployment.objects.filter(pk=deployment_id).first()
    if d is None:  # deleted meanwhile: nothing to set
        return
    is_loaded = listed is not None and any(
        m.id == d.server_model_id and m.state == "loaded" for m in listed
    )
    now = timezone.now()
    under_way = Deployment.objects.filter(pk=deployment_id, state__in=(DS.LOADING, DS.UNLOADING))
    if held_by is None:
        under_way = under_way.filter(worker__isnull=True)
    else:
        under_way = under_way.filter(worker_id=held_by)
    under_way.update(
        state=DS.LOADED if is_loaded else DS.UNLOADED,
        state_changed_at=now,
        worker=None,
        loaded_at=now if is_loaded else None,
        load_progress=None,
    )


def all_servers() -> list[Server]:
    return list(Server.objects.all())


def server_for_adapter(server_id: int) -> tuple[Server, list[str]] | None:
    """The server, and how its deployments name its models (`Adapter.spell`); None once it
    is deleted."""
    server = Server.objects.filter(pk=server_id).first()
    if server is None:
        return None
    return server, list(server.deployments.values_list("server_model_id", flat=True))

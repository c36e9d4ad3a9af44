"""An operator asking for a load, an unload, a drain or an enable: checked against what the
deployment is now, then stored as an `Intent` with its first trace row, for a worker's loop
to carry out (`scheduler.intents`). The operator API (`scheduler.api.servers`) and the
admin's actions ask through here alike; a refusal is an `ApiError` (its message says why)."""

from django.db import transaction

from backends.adapters.registry import takes_load_options
from backends.models import Deployment, DeploymentState, Server

from . import channel_hints, wakeup
from .api.errors import ApiError
from .models import Intent, IntentTrace

DS = DeploymentState


def record(
    server: Server, action: str, by: str, deployment=None, via: str = "the API", **fields
) -> Intent:
    """Store the intent with its first trace row, and wake the workers on commit."""
    with transaction.atomic():
        intent = Intent.objects.create(
            server=server, action=action, deployment=deployment, requested_by=by, **fields
        )
        IntentTrace.objects.create(
            intent=intent, status=intent.status, reason=f"asked by {by} through {via}"
        )
        wakeup.notify_in_transaction()
        transaction.on_commit(wakeup.wake_local)
        transaction.on_commit(channel_hints.dashboard_changed)  # its server's card shows it
    return intent


def conflict(message: str, code: str) -> ApiError:
    return ApiError(409, message, code=code)


def ask_load(d: Deployment, by: str, options: dict | None = None, via: str = "the API") -> Intent:
    if not d.enabled:
        raise conflict(f"{d} is disabled: enable it first.", "model_disabled")
    if d.state in (DS.LOADED, DS.LOADING):
        raise conflict(f"{d} is already {d.state}.", f"already_{d.state}")
    if options and not takes_load_options(d.server.kind):
        raise ApiError(
            400,
            f"{d.server.name} is a {d.server.kind} server, which takes no load options: set"
            " them in the server's own configuration (a router's preset, llama-swap's cmd).",
            param="options",
            code="load_options_not_taken",
        )
    return record(d.server, Intent.Action.LOAD, by, d, via, options=options or {})


def ask_unload(d: Deployment, by: str, force: bool = True, via: str = "the API") -> Intent:
    if d.state != DS.LOADED:
        raise ApiError(
            404 if d.state in (DS.UNLOADED, DS.FAILED) else 409,
            f"{d} is {d.state}, not loaded.",
            param="model",
            code="model_not_loaded" if d.state in (DS.UNLOADED, DS.FAILED) else f"model_{d.state}",
        )
    if d.in_flight and not force:
        raise conflict(
            f"{d} is serving {d.in_flight} request(s); send force true to unload it once"
            " they finish.",
            "model_busy",
        )
    return record(d.server, Intent.Action.UNLOAD, by, d, via, force=force)

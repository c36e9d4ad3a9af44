"""The full state a dashboard shows, as plain JSON-able dicts (messages carry full state)."""

from django.utils import timezone

from backends.models import Deployment, DeploymentState, Server
from scheduler.api.intake import position_in_line
from scheduler.models import WAITING_STATES, Request

WAITING_SHOWN = 100


def load_progress(d: Deployment, now) -> dict | None:
    if d.state != DeploymentState.LOADING or d.load_started_at is None:
        return None
    elapsed = (now - d.load_started_at).total_seconds()
    expected = d.avg_load_s
    if d.load_progress is not None and not d.load_progress_estimated and d.load_progress > 0:
        fraction, estimated = d.load_progress, False
    elif expected:
        fraction, estimated = min(elapsed / expected, 0.99), True
    else:
        fraction, estimated = None, True
    return {
        "elapsed_s": round(elapsed, 1),
        "expected_s": expected and round(expected, 1),
        "fraction": fraction,
        "estimated": estimated,
    }


def overview() -> dict:
    now = timezone.now()
    servers = []
    for s in Server.objects.prefetch_related("deployments__model"):
        deployments = list(s.deployments.all())
        servers.append(
            {
                "name": s.name,
                "kind": s.kind,
                "simulated": s.is_simulated,
                "health": s.health,
                "enabled": s.enabled,
                "slots": s.slots,
                "in_use": sum(d.in_flight for d in deployments),
                "cooldown_until": s.cooldown_until and s.cooldown_until.isoformat(),
                "models": [
                    {
                        "model": d.model.name,
                        "state": d.state,
                        "in_flight": d.in_flight,
                        "pinned": d.pinned,
                        "progress": load_progress(d, now),
                    }
                    for d in deployments
                    if d.state != DeploymentState.UNLOADED
                ],
            }
        )
    waiting = Request.objects.filter(state__in=WAITING_STATES).select_related("server")
    rows = [
        {
            "id": str(r.pk),
            "model": r.model_name,
            "priority": r.priority_name,
            "state": r.state,
            "server": r.server.name if r.server else None,
            "waited_s": round((now - r.created_at).total_seconds(), 1),
        }
        for r in waiting.order_by("priority", "created_at", "id")[:WAITING_SHOWN]
    ]
    return {
        "at": now.isoformat(),
        "servers": servers,
        "waiting": rows,
        "waiting_total": waiting.count(),
    }


def request_detail(request_id) -> dict | None:
    r = Request.objects.select_related("server", "deployment").filter(pk=request_id).first()
    if r is None:
        return None
    now = timezone.now()
    eta_s = None
    position = position_in_line(r)
    if r.deployment and r.deployment.avg_inference_s and position:
        eta_s = round(r.deployment.avg_inference_s * position, 1)
    return {
        "id": str(r.pk),
        "model": r.model_name,
        "priority": r.priority_name,
        "state": r.state,
        "server": r.server.name if r.server else None,
        "position": position,
        "eta_s": eta_s,
        "load": load_progress(r.deployment, now) if r.deployment else None,
        "error": r.error,
        "trace": [
            {
                "at": t.at.isoformat(),
                "from": t.from_state,
                "to": t.to_state,
                "server": t.server,
                "reason": t.reason,
            }
            for t in r.traces.all()
        ],
    }

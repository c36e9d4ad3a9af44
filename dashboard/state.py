"""The full state a dashboard shows, as plain JSON-able dicts (messages carry full state).

Each function runs a fixed number of queries however many rows it shows: the overview reads
the workers, servers, their deployments, the operators' open intents and three bounded
lists of requests, nothing per row.
"""

from datetime import datetime

from django.db.models import Prefetch, Q
from django.urls import reverse
from django.utils import timezone

from backends.models import Deployment, DeploymentState, Health, LoadCause, Server
from scheduler.durations import to_ms as seconds
from scheduler.intents import open_intents
from scheduler.models import TERMINAL_STATES, WAITING_STATES, Request, State, Worker
from scheduler.reasons_shown import reported_fraction, server_fraction
from scheduler.reasons_shown import shown as shown_reason
from scheduler.snapshot import unused_restore
from scheduler.streams import answer_text, tool_calls_of

from . import charts, forecast
from .models import EtaCheck
from .watch_tokens import token_for

WAITING_SHOWN = 100
RUNNING_SHOWN = 100
RECENT_SHOWN = 20
# An estimated bar stops short of full: the load is done when the server says so.
ESTIMATE_CAP = 0.99


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def server_status(s: Server, now: datetime) -> dict:
    """One word an operator reads at a glance, and when a cooldown ends."""
    cooling = s.health == Health.COOLDOWN
    if not s.enabled:
        status = "disabled"
    elif cooling:
        status = "cooldown"
    else:
        status = s.health
    left = (s.cooldown_until - now).total_seconds() if cooling and s.cooldown_until else None
    return {
        "status": status,
        "cooldown_until": iso(s.cooldown_until) if cooling else None,
        # Past its end a cooldown lasts until the probe answers.
        "cooldown_left_s": seconds(max(left, 0.0)) if left is not None else None,
        "last_error": s.last_error if status in ("down", "cooldown") else "",
    }


def load_progress(d: Deployment, now: datetime) -> dict | None:
    """How far a load has come: the adapter's own figure when it reports one, else the time
    elapsed over the deployment's moving average of load time (before one is measured, what
    its first load is expected to take), marked as an estimate."""
    if d.state != DeploymentState.LOADING or d.load_started_at is None:
        return None
    elapsed = max((now - d.load_started_at).total_seconds(), 0.0)
    reported = server_fraction(d)
    expected = d.avg_load_s
    if expected is None and reported is None:
        expected = forecast.first_load_s(d)
    if reported is not None:
        fraction, estimated = reported, False
    elif expected:
        fraction, estimated = min(elapsed / expected, ESTIMATE_CAP), True
    else:
        fraction, estimated = None, True
    return {
        "started_at": iso(d.load_started_at),
        "elapsed_s": seconds(elapsed),
        "expected_s": seconds(expected),
        "fraction": None if fraction is None else round(fraction, 3),
        "estimated": estimated,
    }


def after_victims(progress: dict | None, leaving: str) -> None:
    """A load's bar while `leaving` still unload on its server (what unloads while a load
    is under way there is that load's victims, and the server may let what others sent
    them finish first): it names them, and has no figure, since the load has not begun."""
    if progress and leaving:
        progress.update(unloading=leaving, fraction=None)


def unloading_on(server_id: int) -> str:
    rows = Deployment.objects.filter(server_id=server_id, state=DeploymentState.UNLOADING)
    return ", ".join(rows.order_by("model__name").values_list("model__name", flat=True))


def run_left_s(r: Request, now: datetime, runs: forecast.Runs | None = None) -> float | None:
    """Seconds until a running request ends, as the forecast expects it (`Runs.left_s`:
    its model and class's run time, else its deployment's moving average, no longer than
    the tokens it asks for take); None when nothing has run there yet."""
    d = r.deployment
    if r.state != State.PROCESSING or d is None or d.avg_inference_s is None or not r.started_at:
        return None
    runs = runs or forecast.Runs.read()
    return seconds(runs.left_s(r, d.avg_inference_s, now))


def eta_of(r: Request, position: int | None, now: datetime) -> float | None:
    """Seconds until a waiting request is sent (the forecast, within the first
    `forecast.LINE_READ` of the line, `position` its place), or until a running one ends;
    None otherwise, or when nothing has shown how long it takes."""
    if r.state in WAITING_STATES and position is not None and position <= forecast.LINE_READ:
        # 50 rows more: requests of worse classes that aged ahead of it go first too.
        return seconds(forecast.head(now, position + 50).etas.get(r.pk))
    return run_left_s(r, now)


def is_restore(d: Deployment) -> bool:
    """Loading, or loaded and unused, because an idle server restores it (nobody asked)."""
    loading = d.state == DeploymentState.LOADING and d.load_cause == LoadCause.RESTORE
    return loading or unused_restore(d)


def deployment_row(d: Deployment, now: datetime) -> dict:
    return {
        "model": d.model.name,
        "server_model_id": d.server_model_id,
        "state": d.state,
        "in_flight": d.in_flight,
        "slots": d.slots,
        "pinned": d.pinned,
        "keep_loaded_hours": d.keep_loaded_hours,
        "restore": is_restore(d),
        # Loaded on the server by someone else: Switchyard found it there and uses it.
        "outside": d.load_cause == LoadCause.OUTSIDE and d.state == DeploymentState.LOADED,
        "progress": load_progress(d, now),
        "error": d.last_error if d.state == DeploymentState.FAILED else "",
    }


def intents_by_server() -> dict[int, list[dict]]:
    """Per server, the operators' intents not yet finished, oldest first, each with its
    latest step: what an operator asked for and what it waits for (one read)."""
    found: dict[int, list[dict]] = {}
    for i in open_intents().select_related("deployment__model"):
        found.setdefault(i.server_id, []).append(
            {
                "id": i.pk,
                "action": i.action,
                "model": i.deployment.model.name if i.deployment_id else None,
                "status": i.status,
                "reason": i.last_reason or "",
                "requested_by": i.requested_by,
                "created_at": iso(i.created_at),
            }
        )
    return found


def server_row(s: Server, now: datetime, intents: list[dict] | None = None) -> dict:
    deployments = list(s.deployments.all())  # prefetched, without the unloaded ones
    models = [deployment_row(d, now) for d in deployments]
    leaving = ", ".join(m["model"] for m in models if m["state"] == DeploymentState.UNLOADING)
    for m in models:
        after_victims(m["progress"], leaving)
    return {
        "name": s.name,
        "kind": s.kind,
        "kind_label": s.get_kind_display(),
        "simulated": s.is_simulated,
        "enabled": s.enabled,
        "health": s.health,
        **server_status(s, now),
        "slots": s.slots,
        "in_use": sum(d.in_flight for d in deployments),
        "models": models,
        "intents": intents or [],
    }


def request_row(r: Request, now: datetime, ahead: int | None = None) -> dict:
    """A request as the pages list it; `reason` while it waits (`ahead`: how many are
    before it in line, for one a pass has not explained yet)."""
    return {
        "id": str(r.pk),
        "model": r.model_name,
        "kind": r.kind,
        "priority": r.priority_name,
        "state": r.state,
        "server": r.server.name if r.server else None,
        "created_at": iso(r.created_at),
        "waited_s": seconds(r.waited_s(now)),
        **reason_fields(shown_reason(r.reason, r.state, now, ahead, reported_fraction(r))),
    }


def reason_fields(shown: dict | None) -> dict:
    """Why it waits, as the pages show it: the text (`reason`, what dashboard.js and
    watch.js show) and its kind."""
    if shown is None:
        return {"reason": None, "reason_kind": None}
    return {"reason": shown["text"], "reason_kind": shown["kind"]}


def caller(r: Request) -> str | None:
    """Whose request it is, for the staff's lists: the key's name, and its team's."""
    key = r.api_key
    if key is None:
        return None
    return f"{key.name} ({key.team.name})" if key.team else key.name


def waiting_rows(now: datetime) -> list[dict]:
    """The head of the line in the policy's order, each with its place and the forecast's
    ETA (seconds until it is sent). Rows further back cannot be ahead of these."""
    line = forecast.head(now, WAITING_SHOWN, related=True)
    rows = []
    for position, r in enumerate(line.requests, start=1):
        row = request_row(r, now, ahead=position - 1)
        row["position"] = position
        row["caller"] = caller(r)
        row["eta_s"] = seconds(line.etas.get(r.pk))
        rows.append(row)
    return rows


def overview(now: datetime | None = None) -> dict:
    now = now or timezone.now()
    classes = charts.class_summary(now)
    shown = Deployment.objects.exclude(state=DeploymentState.UNLOADED).select_related("model")
    servers = Server.objects.prefetch_related(Prefetch("deployments", queryset=shown))
    running = (
        Request.objects.filter(state=State.PROCESSING)
        .select_related("server", "deployment", "api_key__team")
        .order_by("started_at", "id")[:RUNNING_SHOWN]
    )
    recent = (
        Request.objects.filter(state__in=TERMINAL_STATES)
        .select_related("server", "api_key__team")
        .order_by("-finished_at", "-created_at")[:RECENT_SHOWN]
    )
    runs = forecast.Runs.read()
    asked = intents_by_server()
    return {
        "at": iso(now),
        "workers": workers_state(now),
        "servers": [server_row(s, now, asked.get(s.pk)) for s in servers],
        "waiting": waiting_rows(now),
        "waiting_total": sum(c["waiting"] for c in classes),
        "classes": classes,
        "running": [
            {
                **request_row(r, now),
                "caller": caller(r),
                "eta_s": run_left_s(r, now, runs),
                "started_at": iso(r.started_at),
            }
            for r in running
        ],
        "recent": [
            {
                **request_row(r, now),
                "caller": caller(r),
                "finished_at": iso(r.finished_at),
                "took_s": took_s(r),
                "error": r.error,
            }
            for r in recent
        ],
    }


def workers_state(now: datetime) -> dict:
    """Whether anything schedules: the live workers (heartbeat fresher than
    `SWITCHYARD_WORKER_STALE_S`), the last heartbeat of any, and the live ones whose passes
    fail (`runtime.failing_passes`). The page says so above everything else."""
    stale = Worker.live_since(now)
    rows = list(
        Worker.objects.values_list("id", "host", "last_heartbeat", "failing_since", "failing_error")
    )
    live = [row for row in rows if row[2] >= stale]
    return {
        "live": len(live),
        "last_heartbeat": iso(max((row[2] for row in rows), default=None)),
        "failing": [
            {"id": wid, "host": host, "since": iso(since), "error": error}
            for wid, host, _, since, error in live
            if since is not None
        ],
    }


def took_s(r: Request) -> float | None:
    """Its run, as the admin counts it, beside `waited_s`: none until it ended, or if it was
    never sent."""
    if r.started_at and r.finished_at:
        return seconds(max((r.finished_at - r.started_at).total_seconds(), 0))
    return None


def ahead_of(r: Request) -> Q:
    """Waiting requests before `r` in line: a better class, or the same class and earlier."""
    return Q(state__in=WAITING_STATES) & (
        Q(priority__lt=r.priority) | Q(priority=r.priority, created_at__lt=r.created_at)
    )


def request_detail(
    request_id, now: datetime | None = None, answer_chars: int = 2000
) -> dict | None:
    now = now or timezone.now()
    r = (
        Request.objects.select_related("server", "deployment", "api_key__team")
        .prefetch_related("traces")
        .filter(pk=request_id)
        .first()
    )
    if r is None:
        return None
    position = waiting_total = None
    if r.state in WAITING_STATES:
        position = Request.objects.filter(ahead_of(r)).count() + 1
        waiting_total = Request.objects.filter(state__in=WAITING_STATES).count()
    eta = eta_of(r, position, now)
    check = EtaCheck.objects.filter(request_id=r.pk).first()
    load = load_progress(r.deployment, now) if r.deployment else None
    if load:
        after_victims(load, unloading_on(r.deployment.server_id))
    return {
        **request_row(r, now, ahead=position - 1 if position else None),
        "caller": caller(r),  # for the staff's page; the watch page shows no caller
        "at": iso(now),
        "position": position,
        "waiting_total": waiting_total,
        "eta_s": eta,
        "eta_first": eta_first(check),
        "eta_accuracy": charts.eta_accuracy(now),
        "load": load,
        "started_at": iso(r.started_at),
        "finished_at": iso(r.finished_at),
        "took_s": took_s(r),
        "attempts": r.attempts,
        "error": r.error,
        "answer": shown_answer(r.result)[:answer_chars],
        # For staff to hand to the caller: the page it can follow without a login.
        "watch_url": reverse("watch-live", args=[token_for(r.pk)]),
        "stream": r.stream,
        "trace": [
            {
                "at": iso(t.at),
                "from": t.from_state,
                "to": t.to_state,
                "server": t.server,
                "reason": t.reason,
            }
            for t in r.traces.all()
        ],
    }


def shown_answer(result: dict | None) -> str:
    """Its text, then each tool it calls (`→ get_weather({"city": "Oslo"})`): an agent's
    turn that only calls a tool has no text, and would read as an empty answer."""
    lines = [answer_text(result) or ""] + [f"→ {call}" for call in tool_calls_of(result)]
    return "\n".join(line for line in lines if line)


def eta_first(check: EtaCheck | None) -> dict | None:
    """The ETA the request was first given, and once it started, how far off it was."""
    if check is None:
        return None
    return {
        "given_at": iso(check.given_at),
        "given_s": seconds(check.given_s),
        "position": check.position,
        "error_s": seconds(check.error_s),
    }

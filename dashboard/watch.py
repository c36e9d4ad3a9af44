"""The watch page: what a caller holding a request's watch URL sees, without a login. Its
place, the ETA with how often ETAs have been right lately, why it waits, its model's load,
its trace as it happens, the answer (streamed live to the page for a streamed request), and
a clear end. Never the prompt."""

from datetime import datetime

from django.http import Http404, JsonResponse
from django.shortcuts import render

from . import state
from .watch_tokens import request_id_for

SHOWN = (
    "id",
    "at",
    "state",
    "model",
    "priority",
    "stream",
    "position",
    "waiting_total",
    "eta_s",
    "eta_first",
    "eta_accuracy",
    "load",
    "created_at",
    "started_at",
    "finished_at",
    "waited_s",
    "reason",
    "reason_kind",
    "error",
    "answer",
    "trace",
)
ANSWER_CHARS = 20_000


def watch_state(request_id, now: datetime | None = None) -> dict | None:
    detail = state.request_detail(request_id, now, answer_chars=ANSWER_CHARS)
    if detail is None:
        return None
    shown = {k: detail.get(k) for k in SHOWN}
    shown["trace"] = [{k: t[k] for k in ("at", "to", "reason")} for t in detail["trace"]]
    shown["final"] = detail["state"] in ("completed", "failed", "cancelled", "expired")
    return shown


def state_for_token(token: str) -> dict:
    request_id = request_id_for(token)
    found = watch_state(request_id) if request_id else None
    if found is None:
        raise Http404("This watch link is not valid, or its request is gone.")
    return found


def watch_page(request, token: str):
    return render(
        request, "dashboard/watch.html", {"initial": state_for_token(token), "token": token}
    )


def watch_json(request, token: str):
    return JsonResponse(state_for_token(token))

"""Watch URLs: a signed, unguessable link to one request's progress, without a login.

The token is the request's id signed with SECRET_KEY (HMAC-SHA256, salted for this use): a
link can be shared, and nobody can make one for a request they were not given. The page and
its JSON show where the request is (state, position, ETA, trace, load progress), never its
prompt or its answer."""

import uuid

from django.core import signing
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from dashboard import state

SALT = "switchyard.watch"
# What a watcher may see of a request (dashboard.state.request_detail has more: the answer).
SHOWN = (
    "id",
    "model",
    "kind",
    "priority",
    "state",
    "server",
    "created_at",
    "started_at",
    "finished_at",
    "waited_s",
    "at",
    "position",
    "waiting_total",
    "eta_s",
    "load",
    "attempts",
    "error",
    "trace",
)


def token_for(request_id) -> str:
    return signing.Signer(salt=SALT, algorithm="sha256").sign(str(request_id))


def watch_url(request_id) -> str:
    """The page's path (as `reverse("watch", ...)` gives it, without the resolver's cost:
    every inference answer carries one)."""
    return f"/watch/{token_for(request_id)}"


def request_of(token: str) -> uuid.UUID:
    try:
        return uuid.UUID(signing.Signer(salt=SALT, algorithm="sha256").unsign(token))
    except (signing.BadSignature, ValueError):
        raise Http404("no such watch link") from None


def watched(token: str) -> dict:
    detail = state.request_detail(request_of(token))
    if detail is None:
        raise Http404("the request is gone")
    return {k: detail[k] for k in SHOWN if k in detail}


@require_GET
def watch_page(http: HttpRequest, token: str) -> HttpResponse:
    return render(
        http,
        "access/watch.html",
        {"initial": watched(token), "json_url": reverse("watch-json", args=[token])},
    )


@require_GET
def watch_json(http: HttpRequest, token: str) -> JsonResponse:
    return JsonResponse(watched(token))

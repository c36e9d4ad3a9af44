"""`GET /api/v1/requests`: the caller's own requests, newest first, a page at a time.

Pages are cut by a cursor (the last row's creation time and id, opaque to the caller), not
by an offset: a page costs the same however deep, and rows that arrive meanwhile do not
shift the next page."""

import base64
import binascii
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.urls import reverse

from ..models import Priority, Request, State
from .errors import ApiError

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
PRIORITIES = {p.label: p.value for p in Priority}


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def encode_cursor(request: Request) -> str:
    raw = f"{request.created_at.isoformat()}|{request.pk}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, pk = raw.partition("|")
        return datetime.fromisoformat(at), uuid.UUID(pk)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad("cursor", "cursor is not one this API gave") from None


def parse_limit(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError:
        raise bad("limit", "limit must be an integer", "invalid_type") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise bad("limit", f"limit must be from 1 to {MAX_LIMIT}")
    return limit


def filtered(rows: QuerySet, params) -> QuerySet:
    """`state`, `model` and `priority`, each one value or several separated by commas."""
    if states := params.get("state"):
        wanted = states.split(",")
        if unknown := set(wanted) - set(State.values):
            raise bad(
                "state", f"unknown state {sorted(unknown)[0]!r}; one of {', '.join(State.values)}"
            )
        rows = rows.filter(state__in=wanted)
    if models := params.get("model"):
        names = models.split(",")
        rows = rows.filter(Q(model_name__in=names) | Q(model__name__in=names))
    if priorities := params.get("priority"):
        wanted = priorities.split(",")
        if unknown := set(wanted) - PRIORITIES.keys():
            raise bad(
                "priority", f"unknown class {sorted(unknown)[0]!r}; one of {', '.join(PRIORITIES)}"
            )
        rows = rows.filter(priority__in=[PRIORITIES[p] for p in wanted])
    return rows


def summary(r: Request) -> dict[str, Any]:
    return {
        "id": str(r.pk),
        "kind": r.kind,
        "model": r.model_name,
        "priority": r.priority_name,
        "state": r.state,
        "server": r.server.name if r.server_id else None,
        "created_at": r.created_at,
        "finished_at": r.finished_at,
        "error_code": r.error_code or None,
        "url": reverse("request-detail", args=[r.pk]),
    }


def page(own: QuerySet, params) -> dict[str, Any]:
    """One page of `own` (the caller's requests) as `params` ask."""
    limit = parse_limit(params.get("limit"))
    rows = filtered(own, params).select_related("server").order_by("-created_at", "-id")
    if cursor := params.get("cursor"):
        at, pk = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    found = list(rows[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    return {
        "object": "list",
        "data": [summary(r) for r in found],
        "has_more": more,
        "next_cursor": encode_cursor(found[-1]) if more else None,
    }

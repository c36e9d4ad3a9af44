"""The API's lists, a page at a time in one shape: `GET /api/v1/requests` (the caller's own
requests, newest first) and `GET /api/v1/servers` (by name) answer
`{"object": "list", "data": [...], "has_more": ..., "next_cursor": ...}` (`page`).

Pages are cut by a cursor (the last row's values of the list's order, opaque to the caller),
not by an offset: a page costs the same however deep, and rows that arrive meanwhile do not
shift the next page."""

import base64
import binascii
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from ..models import Priority, Request, State
from ..reasons_shown import reported_fraction
from ..reasons_shown import shown as shown_reason
from .errors import ApiError

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
PRIORITIES = {p.label: p.value for p in Priority}


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def encode_cursor(row: Model, order: tuple[str, ...]) -> str:
    values = [getattr(row, name.lstrip("-")) for name in order]
    raw = json.dumps([v.isoformat() if hasattr(v, "isoformat") else str(v) for v in values])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, model: type[Model], order: tuple[str, ...]) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        values = json.loads(raw)
        if not isinstance(values, list) or len(values) != len(order):
            raise ValueError(cursor)
        return [
            model._meta.get_field(name.lstrip("-")).to_python(value)
            for name, value in zip(order, values, strict=True)
        ]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, ValidationError):
        raise bad("cursor", "cursor is not one this API gave") from None


def after(order: tuple[str, ...], values: list[Any]) -> Q:
    """The rows that come after `values` in `order` (each name, `-` for descending)."""
    found = Q(pk__in=[])
    for i, name in enumerate(order):
        field = name.lstrip("-")
        beyond = {f"{field}__{'lt' if name.startswith('-') else 'gt'}": values[i]}
        same = {n.lstrip("-"): v for n, v in zip(order[:i], values[:i], strict=True)}
        found |= Q(**same, **beyond)
    return found


def page(
    rows: QuerySet,
    params,
    order: tuple[str, ...],
    items: Callable[[list], list[dict[str, Any]]],
    default_limit: int = DEFAULT_LIMIT,
) -> dict[str, Any]:
    """One page of `rows` in `order` as `params` ask (`limit`, `cursor`); `items` turns the
    page's rows into what the API shows of each."""
    limit = parse_limit(params.get("limit"), default_limit)
    rows = rows.order_by(*order)
    if cursor := params.get("cursor"):
        rows = rows.filter(after(order, decode_cursor(cursor, rows.model, order)))
    found = list(rows[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    return {
        "object": "list",
        "data": items(found),
        "has_more": more,
        "next_cursor": encode_cursor(found[-1], order) if more else None,
    }


def page_schema(name: str, item: serializers.Serializer) -> type[serializers.Serializer]:
    """The schema of a page of `item`s, for drf-spectacular."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "object": serializers.CharField(default="list"),
            "data": item,
            "has_more": serializers.BooleanField(),
            "next_cursor": serializers.CharField(allow_null=True, help_text="Pass as `cursor`."),
        },
    )


def page_parameters(default_limit: int = DEFAULT_LIMIT) -> list[OpenApiParameter]:
    return [
        OpenApiParameter("limit", int, description=f"1 to {MAX_LIMIT} ({default_limit})"),
        OpenApiParameter("cursor", str, description="`next_cursor` of the page before"),
    ]


def parse_limit(value: str | None, default: int = DEFAULT_LIMIT) -> int:
    if value is None or value == "":
        return default
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


def summary(r: Request, now: datetime) -> dict[str, Any]:
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
        "reason": shown_reason(r.reason, r.state, now, reported=reported_fraction(r)),
        "url": reverse("request-detail", args=[r.pk]),
    }


def requests_page(own: QuerySet, params) -> dict[str, Any]:
    """One page of `own` (the caller's requests), newest first, filtered as `params` ask."""
    rows = filtered(own, params).select_related("server", "deployment")
    now = timezone.now()
    return page(
        rows, params, ("-created_at", "-id"), lambda found: [summary(r, now) for r in found]
    )

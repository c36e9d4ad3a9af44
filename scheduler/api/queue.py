"""The operator API for the line: every request that has not ended, whoever sent it, and
cancelling many at once (a runaway app's flood, the work of a model that is going away).

`GET /api/v1/queue` and `POST /api/v1/queue/cancel`; the callers of the servers' operator API
(staff or an operator key). A key's own requests stay its own elsewhere: `GET
/api/v1/requests` lists only the caller's."""

import logging
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from access.models import ApiKey

from ..models import WAITING_STATES, Request, State
from ..store import cancel_requests
from . import listing
from .callers import StaffSession, operator_of
from .errors import ApiError
from .jobs import RequestSummary
from .keys import ERRORS, checked, in_team, key_named
from .strict import Strict

log = logging.getLogger(__name__)
NOT_ENDED = [*WAITING_STATES, State.PROCESSING]
LINE_ORDER = ("priority", "created_at", "id")  # by class, then arrival, as positions count
MAX_CANCELS = 1000  # a call's work; `remaining` says to call again


class QueueItem(RequestSummary):
    key = serializers.CharField(allow_null=True, help_text="Its API key's prefix; null: none.")
    key_name = serializers.CharField(allow_null=True)
    team = serializers.CharField(allow_null=True, help_text="Its key's team; null: none.")


QueuePage = listing.page_schema("QueuePage", QueueItem(many=True))


def whose(rows: QuerySet, params) -> QuerySet:
    """`key` (a prefix) and `team` (a name; empty: keys in no team), as the keys API names
    them: an unknown one is a 404, not an empty list."""
    if key := params.get("key"):
        rows = rows.filter(api_key=key_named(key))
    return in_team(rows, params.get("team"), "api_key__team")


def queue_body(found: list[Request]) -> list[dict[str, Any]]:
    now = timezone.now()
    items = []
    for r in found:
        key: ApiKey | None = r.api_key
        items.append(
            listing.summary(r, now)
            | {
                "key": key.prefix if key else None,
                "key_name": key.name if key else None,
                "team": key.team.name if key and key.team_id else None,
            }
        )
    return items


class Queue(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="The line: every request not ended, whoever sent it (operators)",
        parameters=[
            OpenApiParameter(
                "state",
                str,
                description="pending, needs_loading, ready or"
                " processing, or several separated by commas (all four)",
            ),
            OpenApiParameter("model", str, description="A model name, or several"),
            OpenApiParameter("priority", str, description="A class, or several"),
            OpenApiParameter("key", str, description="An API key's prefix"),
            OpenApiParameter("team", str, description="A team's name; empty: keys in no team"),
            *listing.page_parameters(listing.MAX_LIMIT),
        ],
        responses={200: QueuePage, **ERRORS},
    )
    def get(self, request: DrfRequest) -> Response:
        operator_of(request)
        params = request.query_params
        rows = whose(listing.filtered(Request.objects.filter(state__in=NOT_ENDED), params), params)
        if ended := set(params.get("state", "").split(",")) & {*State.values} - {*NOT_ENDED}:
            raise listing.bad("state", f"{sorted(ended)[0]} requests have ended: not in line")
        rows = rows.select_related("server", "api_key__team")
        return Response(listing.page(rows, params, LINE_ORDER, queue_body, listing.MAX_LIMIT))


class CancelIn(Strict, serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.UUIDField(), required=False, help_text="These requests."
    )
    key = serializers.CharField(required=False, help_text="An API key's prefix: its requests.")
    team = serializers.CharField(
        required=False, allow_blank=True, help_text="A team's name: its keys' requests."
    )
    model = serializers.CharField(required=False, help_text="A model name, or several.")
    priority = serializers.CharField(required=False, help_text="A class, or several.")
    all = serializers.BooleanField(
        default=False, help_text="Every request: needed when nothing else narrows the call."
    )
    processing = serializers.BooleanField(
        default=False,
        help_text="Stop those at their servers too; else only waiting requests are cancelled.",
    )
    reason = serializers.CharField(
        required=False, max_length=200, help_text="Said in each cancelled request's trace."
    )

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        data = super().validate(data)  # a misspelt narrowing must not become `all`
        narrowed = {"ids", "key", "team", "model", "priority"} & data.keys()
        if not narrowed and not data["all"]:
            raise ApiError(
                400,
                "Name the requests to cancel (ids, key, team, model or priority),"
                " or set all to cancel every one.",
                code="missing",
            )
        return data


class CancelOut(serializers.Serializer):
    cancelled = serializers.IntegerField(help_text="How many this call cancelled.")
    remaining = serializers.IntegerField(
        help_text=f"How many it matched beyond its {MAX_CANCELS}: call again for those."
    )


class CancelQueued(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="Cancel the requests that match, whoever sent them (operators)",
        request=CancelIn,
        responses={200: CancelOut, **ERRORS},
    )
    def post(self, request: DrfRequest) -> Response:
        caller = operator_of(request)
        data = checked(CancelIn(data=request.data)).validated_data
        states = NOT_ENDED if data["processing"] else list(WAITING_STATES)
        rows = Request.objects.filter(state__in=states)
        if "ids" in data:
            rows = rows.filter(pk__in=data["ids"])
        rows = whose(listing.filtered(rows, data), data)
        ids = list(rows.order_by(*LINE_ORDER).values_list("pk", flat=True)[: MAX_CANCELS + 1])
        said = f": {data['reason']}" if data.get("reason") else ""
        cancelled = cancel_requests(
            ids[:MAX_CANCELS], f"cancelled by {caller.name}{said}", data["processing"]
        )
        remaining = rows.count() if len(ids) > MAX_CANCELS else 0
        asked = {k: f"{len(v)} ids" if k == "ids" else v for k, v in request.data.items()}
        asked.pop("reason", None)
        log.info("%d request(s) cancelled by %s (%s)%s", cancelled, caller.name, asked, said)
        return Response({"cancelled": cancelled, "remaining": remaining})

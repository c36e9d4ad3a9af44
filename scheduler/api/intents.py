"""An operator's intents as the API shows them: `GET /api/v1/intents` (newest first, by
server and status) and `GET /api/v1/intents/{id}`, one intent followed to its end (`done`
or `failed`, with its outcome and each step's trace), as the jobs API follows a request;
`?wait_s=N` waits up to N s for that end. The servers' listing shows only those not yet
finished."""

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from ..models import INTENT_ENDED, Intent
from . import listing, web_stop
from .callers import OPERATOR_REFUSALS, StaffSession, operator_of
from .errors import ApiError
from .jobs import parse_wait_s


class IntentTraceOut(serializers.Serializer):
    at = serializers.DateTimeField()
    status = serializers.CharField()
    reason = serializers.CharField()


class IntentOut(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField(help_text="Where to follow it: GET it until `status` ends.")
    action = serializers.CharField()
    server = serializers.CharField()
    model = serializers.CharField(allow_null=True)
    options = serializers.DictField()
    force = serializers.BooleanField(
        allow_null=True,
        help_text="An unload's: true, a busy model goes once its requests finish (null for"
        " the other actions).",
    )
    status = serializers.ChoiceField(choices=Intent.Status.values)
    requested_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.CharField(help_text="How it ended (empty until it has).")
    trace = IntentTraceOut(many=True)


def intents(rows: QuerySet[Intent] | None = None) -> QuerySet[Intent]:
    """Intents (all, or `rows`) with what their bodies read, in one query each."""
    rows = Intent.objects.all() if rows is None else rows
    return rows.select_related("server", "deployment__model").prefetch_related("traces")


def intent_url(intent_id: int) -> str:
    return reverse("intent-detail", args=[intent_id])


def intent_body(intent: Intent) -> dict[str, Any]:
    return {
        "id": intent.pk,
        "url": intent_url(intent.pk),
        "action": intent.action,
        "server": intent.server.name,
        "model": intent.deployment.model.name if intent.deployment_id else None,
        "options": intent.options,
        "force": intent.force if intent.action == Intent.Action.UNLOAD else None,
        "status": intent.status,
        "requested_by": intent.requested_by,
        "created_at": intent.created_at,
        "finished_at": intent.finished_at,
        "outcome": intent.outcome,
        "trace": [
            {"at": t.at, "status": t.status, "reason": t.reason} for t in intent.traces.all()
        ],
    }


def intents_body(found: list[Intent]) -> list[dict[str, Any]]:
    return [intent_body(i) for i in found]


IntentPage = listing.page_schema("IntentList", IntentOut(many=True))


class IntentList(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="The operators' intents, newest first (operators)",
        parameters=[
            OpenApiParameter("server", str, description="A server's name"),
            OpenApiParameter("status", str, description="pending, running, done or failed"),
            *listing.page_parameters(),
        ],
        responses={200: IntentPage, **OPERATOR_REFUSALS},
    )
    def get(self, request: DrfRequest) -> Response:
        operator_of(request)
        params = request.query_params
        rows = intents()
        if server := params.get("server"):
            rows = rows.filter(server__name=server)
        if status := params.get("status"):
            if status not in Intent.Status.values:
                raise listing.bad("status", f"status must be one of {', '.join(Intent.Status)}")
            rows = rows.filter(status=status)
        return Response(listing.page(rows, params, ("-created_at", "-id"), intents_body))


class IntentDetail(APIView):
    """Served through `intent_detail` (its schema: `openapi.paths`)."""

    authentication_classes = [StaffSession]

    def get(self, request: DrfRequest, intent_id: int) -> Response:
        operator_of(request)
        found = intents().filter(pk=intent_id).first()
        if found is None:
            raise ApiError(
                404, f"No intent {intent_id}.", param="intent_id", code="intent_not_found"
            )
        return Response(intent_body(found))


POLL_S = 0.5  # a long poll re-reads the intent this often: its steps take seconds or more


async def intent_detail(http, intent_id: int):
    """`IntentDetail`, with `?wait_s=N` (at most 300): an intent not yet ended is read again
    until it ends or N s have passed, without holding the thread that sync views share. The
    view answers first, so a caller it refuses learns so at once."""
    view = sync_to_async(IntentDetail.as_view())
    answer = await view(http, intent_id=intent_id)
    wait = http.GET.get("wait_s")
    if not wait or answer.status_code != 200 or answer.data["status"] in INTENT_ENDED:
        return answer
    try:
        wait_s = parse_wait_s(wait)
    except ApiError as error:
        return error.as_json_response()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    rows = Intent.objects.filter(pk=intent_id).values_list("status", flat=True)
    while (left := deadline - loop.time()) > 0 and not web_stop.draining():
        await asyncio.sleep(min(POLL_S, left))
        if await rows.afirst() in INTENT_ENDED:
            break
    return await view(http, intent_id=intent_id)

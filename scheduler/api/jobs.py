"""The async jobs API: submit a request, poll it, cancel it."""

import asyncio
import math

from asgiref.sync import sync_to_async
from django.db import IntegrityError
from django.http import JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from access import auth
from access.models import ApiKey
from access.watch import watch_url
from dashboard.state import eta_of

from ..models import Request, RequestKind
from ..reasons_shown import reported_fraction
from ..reasons_shown import shown as shown_reason
from ..store.completion import cancel_request
from . import callback_url, callers, idempotency, intake, listing, recovery, web_stop
from .errors import ApiError
from .strict import Strict
from .waiting import Subscription, current, stored, until_finished


class SubmitSerializer(Strict, serializers.Serializer):
    kind = serializers.ChoiceField(choices=RequestKind.values, default=RequestKind.CHAT)
    priority = serializers.CharField(required=False, allow_blank=True)
    body = serializers.DictField(help_text="The OpenAI request body, e.g. model and messages.")
    callback_url = serializers.CharField(
        required=False,
        help_text="POSTed the final state, signed, when the request ends. Only hosts in"
        " SWITCHYARD_WEBHOOK_HOSTS.",
    )
    no_server_grace_s = serializers.FloatField(  # its range: intake.check_grace, one code
        required=False,
        help_text="How long to wait while no server can serve its model (all down, disabled,"
        " in cooldown or failed) before failing with no_server_available: 0 to the class's"
        " longest wait (SWITCHYARD_MAX_WAIT_<CLASS>_S); the default"
        " SWITCHYARD_NO_SERVER_GRACE_S.",
    )

    max_wait_s = serializers.FloatField(  # its range: intake.check_max_wait, one code
        required=False,
        help_text="How long it may wait before it expires: more than 0 and at most"
        " SWITCHYARD_MAX_JOB_WAIT_S (a day); the default its class's longest wait"
        " (SWITCHYARD_MAX_WAIT_<CLASS>_S).",
    )


class SubmittedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    url = serializers.CharField(help_text="Where to poll it; also in the Location header.")


class TraceSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    server = serializers.CharField()
    reason = serializers.CharField()


class RequestSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model_name")
    priority = serializers.CharField(source="priority_name")
    server = serializers.CharField(source="server.name", default=None)
    position = serializers.SerializerMethodField()
    eta_s = serializers.SerializerMethodField()
    reason = serializers.SerializerMethodField()
    watch_url = serializers.SerializerMethodField()
    trace = TraceSerializer(source="traces", many=True)

    class Meta:
        model = Request
        fields = [
            "id",
            "kind",
            "model",
            "priority",
            "state",
            "position",
            "eta_s",
            "reason",
            "watch_url",
            "server",
            "created_at",
            "routed_at",
            "ready_at",
            "started_at",
            "finished_at",
            "expires_at",
            "attempts",
            "error",
            "error_code",
            "result",
            "trace",
        ]

    def get_position(self, obj: Request) -> int | None:
        if not hasattr(obj, "position_in_line"):
            obj.position_in_line = intake.position_in_line(obj)
        return obj.position_in_line

    def get_eta_s(self, obj: Request) -> float | None:
        """Seconds until it is sent to a server while it waits, or until it ends while it
        runs, as the watch page forecasts them; null once ended or when nothing has shown
        yet how long its model takes."""
        return eta_of(obj, self.get_position(obj), timezone.now())

    def get_reason(self, obj: Request) -> dict | None:
        """Why it waits (scheduler/reasons.py); a tail not yet seen by a pass: its place."""
        position = self.get_position(obj)
        ahead = position - 1 if position else None
        return shown_reason(obj.reason, obj.state, timezone.now(), ahead, reported_fraction(obj))

    def get_watch_url(self, obj: Request) -> str:
        return watch_url(obj.pk)


def get_request(request_id, api_key: ApiKey | None) -> Request:
    """The request, if the caller's key sent it (any, with auth off or for an operator key):
    another key's answers exactly as an unknown id."""
    found = stored(request_id)
    if found is None or not (api_key is None or api_key.operator or found.api_key_id == api_key.pk):
        raise ApiError(404, f"No request with id {request_id}.", code="request_not_found")
    return found


class RequestSummary(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    model = serializers.CharField()
    priority = serializers.CharField()
    state = serializers.CharField()
    server = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    error_code = serializers.CharField(allow_null=True)
    reason = serializers.DictField(
        allow_null=True,
        help_text="While it waits, why (kind, text, details), as the last pass that changed"
        " it said; null otherwise.",
    )
    url = serializers.CharField()


RequestPage = listing.page_schema("RequestPage", RequestSummary(many=True))


class RequestList(APIView):
    @extend_schema(
        summary="List your requests, newest first",
        parameters=[
            OpenApiParameter("state", str, description="A state, or several separated by commas"),
            OpenApiParameter("model", str, description="A model name, or several"),
            OpenApiParameter("priority", str, description="A class, or several"),
            *listing.page_parameters(),
        ],
        responses={200: RequestPage},
    )
    def get(self, http):
        api_key = auth.caller(http.headers.get("Authorization"))
        return Response(listing.requests_page(callers.own_requests(api_key), http.query_params))

    @extend_schema(request=SubmitSerializer, responses={202: SubmittedSerializer})
    def post(self, http):
        api_key = auth.caller(http.headers.get("Authorization"))
        submit = SubmitSerializer(data=http.data)
        submit.is_valid(raise_exception=True)
        data = submit.validated_data
        priority = http.headers.get("X-Priority") or data.get("priority")
        callback = (
            callback_url.checked(data["callback_url"], api_key) if "callback_url" in data else ""
        )
        claim = idempotency.claim_of(http.headers.get(idempotency.HEADER), api_key)
        earlier = claim.request() if claim else None
        if earlier is None:
            try:
                created = recovery.accept(
                    data["kind"],
                    data["body"],
                    priority,
                    api_key=api_key,
                    idempotency=claim,
                    callback_url=callback,
                    no_server_grace_s=data.get("no_server_grace_s"),
                    max_wait=data.get("max_wait_s"),
                )
            except IntegrityError:  # a call with the same key stored first
                if claim is None or (earlier := claim.request()) is None:
                    raise
        if earlier is not None:  # the key's request, as it is now: stored once
            if error := idempotency.reused(earlier, data["kind"]):
                raise error
            return accepted(earlier, status.HTTP_200_OK, {"Idempotent-Replayed": "true"})
        return accepted(created, status.HTTP_202_ACCEPTED)


def accepted(created: Request, code: int, extra: dict[str, str] | None = None) -> Response:
    """What a POST answers: the request's id, state and where to follow it."""
    url = reverse("request-detail", args=[created.pk])
    watch = watch_url(created.pk)
    body = {
        "id": str(created.pk),
        "state": created.state,
        "priority": created.priority_name,
        "url": url,
        "watch_url": watch,
    }
    headers = {
        "Location": url,
        "X-Switchyard-Priority": created.priority_name,
        "X-Switchyard-Watch-Url": watch,
        **getattr(created, "rate_limits", {}),  # set as it was let in, not on a replay
    }
    return Response(body, status=code, headers=headers | (extra or {}))


def detail_body(request_id, api_key: ApiKey | None) -> dict:
    return dict(RequestSerializer(get_request(request_id, api_key)).data)


def cancel(request_id, api_key: ApiKey | None) -> dict:
    found = get_request(request_id, api_key)
    if not cancel_request(found.pk, "cancelled through the API"):
        found.refresh_from_db()
        raise ApiError(
            409,
            f"The request is {found.state} and can no longer be cancelled.",
            code="not_cancellable",
        )
    return detail_body(request_id, api_key)


async def wait_until_finished(request_id, wait_s: float) -> None:
    """Long poll: return once the request is terminal or `wait_s` has passed."""
    sub = await Subscription(request_id).open()
    try:
        async with asyncio.timeout(wait_s):
            if not (await current(request_id)).is_terminal:
                await web_stop.unless_draining(until_finished(sub, every_s=min(wait_s, 5.0)))
    except TimeoutError:
        pass
    finally:
        await sub.close()


def parse_wait_s(value: str) -> float:
    """Seconds to wait, 0 to 300; a word, NaN or infinity is refused."""
    try:
        seconds = float(value)
    except ValueError:
        raise ApiError(
            400, "wait_s must be a number of seconds", param="wait_s", code="invalid_type"
        ) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ApiError(
            400,
            "wait_s must be a finite number of seconds, 0 or more",
            param="wait_s",
            code="invalid_value",
        )
    return min(seconds, 300.0)


@require_http_methods(["GET", "DELETE"])
async def request_detail(http, request_id) -> JsonResponse:
    """GET: state, position, trace and result (`?wait_s=N` waits up to N s for the end).
    DELETE: cancel, at its server too if it is processing."""
    try:
        api_key = await auth.acaller(http.headers.get("Authorization"))
        if http.method == "DELETE":
            return JsonResponse(await sync_to_async(cancel)(request_id, api_key))
        await sync_to_async(get_request)(request_id, api_key)
        if wait_s := http.GET.get("wait_s"):
            await wait_until_finished(request_id, parse_wait_s(wait_s))
        return JsonResponse(await sync_to_async(detail_body)(request_id, api_key))
    except ApiError as error:
        return error.as_json_response()

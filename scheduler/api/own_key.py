"""`GET /api/v1/key`: the calling key as its app sees it: its limits, its team's, what each
used today (UTC) and what is left, and where it stands now (requests waiting, sent in the
last minute), so an app can slow down before a 429 rather than after. Any key may ask about
itself; nothing secret is in the answer."""

from datetime import timedelta
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from access import auth, usage
from access.limits import RATE_WINDOW_S
from access.models import ApiKey

from ..models import WAITING_STATES, Request
from .errors import ApiError
from .keys import ClassField, Seconds, UsageOut


class LeftOut(serializers.Serializer):
    processing_s = Seconds(
        allow_null=True, help_text="Seconds of processing left today; null: no quota."
    )
    tokens = serializers.IntegerField(
        allow_null=True, help_text="Tokens left today; null: no quota."
    )


class TeamOut(serializers.Serializer):
    name = serializers.CharField()
    max_processing = serializers.IntegerField(allow_null=True)
    daily_processing_s = serializers.IntegerField(allow_null=True)
    daily_tokens = serializers.IntegerField(allow_null=True)
    used_today = UsageOut(help_text="What all its keys' requests that ended today used.")
    left_today = LeftOut()


class NowOut(serializers.Serializer):
    waiting = serializers.IntegerField(help_text="Its requests waiting now (max_waiting).")
    last_minute = serializers.IntegerField(help_text="Its requests sent in the last minute (rpm).")


class OwnKeyOut(serializers.Serializer):
    prefix = serializers.CharField()
    name = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)
    max_priority = ClassField()
    default_priority = ClassField()
    allowed_models = serializers.ListField(child=serializers.CharField())
    rpm = serializers.IntegerField(allow_null=True)
    max_waiting = serializers.IntegerField(allow_null=True)
    max_processing = serializers.IntegerField(allow_null=True)
    daily_processing_s = serializers.IntegerField(allow_null=True)
    daily_tokens = serializers.IntegerField(allow_null=True)
    used_today = UsageOut()
    left_today = LeftOut()
    now = NowOut()
    team = TeamOut(allow_null=True)


KEY_FIELDS = (
    "prefix",
    "name",
    "expires_at",
    "max_priority",
    "default_priority",
    "rpm",
    "max_waiting",
    "max_processing",
    "daily_processing_s",
    "daily_tokens",
)


def described(api_key: ApiKey) -> dict[str, Any]:
    now = timezone.now()
    used = usage.today(now, **usage.of(api_key))
    since = now - timedelta(seconds=RATE_WINDOW_S)
    counts = Request.objects.filter(api_key=api_key.pk, in_batch=False).aggregate(
        waiting=Count("pk", filter=Q(state__in=WAITING_STATES)),
        last_minute=Count("pk", filter=Q(created_at__gte=since)),
    )
    body = {
        **{name: getattr(api_key, name) for name in KEY_FIELDS},
        "allowed_models": api_key.allowed_models or [],
        "used_today": used,
        "left_today": usage.left(api_key, used),
        "now": counts,
        "team": None,
    }
    if (team := api_key.team) is not None:
        team_used = usage.today(now, **usage.of(team))
        body["team"] = {
            "name": team.name,
            "max_processing": team.max_processing,
            "daily_processing_s": team.daily_processing_s,
            "daily_tokens": team.daily_tokens,
            "used_today": team_used,
            "left_today": usage.left(team, team_used),
        }
    return OwnKeyOut(body).data


class OwnKey(APIView):
    @extend_schema(
        summary="Your API key: its limits, its team's, what it used today and what is left",
        responses={
            200: OwnKeyOut,
            401: OpenApiResponse(description="No key, or a key that is not good"),
            404: OpenApiResponse(description="Keys are off here: no key is yours"),
        },
    )
    def get(self, http: DrfRequest) -> Response:
        header = http.headers.get("Authorization")
        if header is None and not auth.required():
            raise ApiError(
                404,
                "API keys are off here (SWITCHYARD_AUTH=off): no key is yours, and no key's"
                " limits apply to your calls.",
                code="no_api_key",
            )
        api_key = auth.verified(header)
        fresh = ApiKey.objects.select_related("team").get(pk=api_key.pk)
        return Response(described(fresh))

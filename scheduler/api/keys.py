"""The operator API for API keys and teams: a script provisions an app's key, sets its
limits, puts it in a team or revokes it, without the admin.

`GET|POST /api/v1/keys`, `GET|PATCH /api/v1/keys/{prefix}`,
`POST /api/v1/keys/{prefix}/rotate-webhook-secret`, `GET|POST /api/v1/teams`,
`GET|PATCH /api/v1/teams/{name}`; the callers of the servers' operator API (staff or an
operator key). A key's secret and webhook secret are in the answer to the POST that makes
them only: the key's hash (and the webhook secret the worker signs with) are kept, and
neither is shown again. An edit reaches every process within SWITCHYARD_AUTH_CACHE_S, as an
admin edit does."""

import logging
from collections import Counter
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from access import usage
from access.models import ApiKey, Team

from ..durations import to_ms
from ..models import Priority
from . import listing
from .callers import OPERATOR_REFUSALS, StaffSession, operator_of
from .errors import ApiError
from .fields import storable
from .strict import Strict

log = logging.getLogger(__name__)
CLASS_NAMES = [p.label for p in Priority]


@extend_schema_field({"type": "string", "enum": CLASS_NAMES})
class ClassField(serializers.ChoiceField):
    """A priority class by its name, as the API's callers name it (`X-Priority`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=CLASS_NAMES, **kwargs)

    def to_representation(self, value: int) -> str:
        return Priority(value).label

    def to_internal_value(self, data: Any) -> int:
        return CLASS_NAMES.index(super().to_internal_value(data))


class Seconds(serializers.FloatField):
    """Seconds to the millisecond, as the usage report gives them."""

    def to_representation(self, value: float) -> float:
        return to_ms(super().to_representation(value))


class UsageOut(serializers.Serializer):
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    processing_s = Seconds()


class TeamSerializer(Strict, serializers.ModelSerializer):
    keys = serializers.IntegerField(
        source="key_count", read_only=True, help_text="How many keys it holds."
    )
    used_today = UsageOut(
        read_only=True, help_text="What all its keys' requests that ended today (UTC) used."
    )

    class Meta:
        model = Team
        fields = [
            "name",
            "weight",
            "max_processing",
            "daily_processing_s",
            "daily_tokens",
            "keys",
            "used_today",
        ]


class KeySerializer(Strict, serializers.ModelSerializer):
    prefix = serializers.CharField(
        read_only=True, help_text="The key's public part: its id here, in the admin and logs."
    )
    team = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Team.objects.all(),
        allow_null=True,
        required=False,
        help_text="The name of its team; null: none.",
    )
    max_priority = ClassField(required=False)
    default_priority = ClassField(required=False)
    allowed_models = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="Empty: every model."
    )
    used_today = UsageOut(
        read_only=True, help_text="What its requests that ended today (UTC) used."
    )

    class Meta:
        model = ApiKey
        fields = [
            "prefix",
            "name",
            "team",
            "created_at",
            "expires_at",
            "revoked",
            "operator",
            "max_priority",
            "default_priority",
            "allowed_models",
            "weight",
            "rpm",
            "max_waiting",
            "max_processing",
            "daily_processing_s",
            "daily_tokens",
            "stream_progress",
            "used_today",
        ]


class NewKeyOut(KeySerializer):
    key = serializers.CharField(help_text="The key itself: shown this once, never again.")
    webhook_secret = serializers.CharField(
        help_text="Signs the callbacks of its jobs: shown this once (rotate it in the admin)."
    )

    class Meta(KeySerializer.Meta):
        fields = [*KeySerializer.Meta.fields, "key", "webhook_secret"]


KeyListOut = listing.page_schema("KeyList", KeySerializer(many=True))
TeamListOut = listing.page_schema("TeamList", TeamSerializer(many=True))
ERRORS = {
    400: OpenApiResponse(description="A field is not valid (`param` names it)"),
    **OPERATOR_REFUSALS,
}
NOT_FOUND = {404: OpenApiResponse(description="No such key or team")}


def with_usage(holders: list, teams: bool = False) -> list:
    """`holders` (keys, or teams) each with `used_today`."""
    found = usage.today_by(timezone.now(), teams)
    for h in holders:
        h.used_today = found.get(h.pk, dict.fromkeys(usage.FIELDS, 0))
    return holders


def keys_body(keys: list[ApiKey]) -> list[dict[str, Any]]:
    return KeySerializer(with_usage(keys), many=True).data


def teams_body(teams: list[Team]) -> list[dict[str, Any]]:
    counted = Counter(ApiKey.objects.filter(team__in=teams).values_list("team", flat=True))
    for team in teams:
        team.key_count = counted[team.pk]
    return TeamSerializer(with_usage(teams, teams=True), many=True).data


def key_named(prefix: str) -> ApiKey:
    # Text the database cannot take (a NUL in the path) names no key: asked, it would fail.
    found = storable(prefix) and ApiKey.objects.select_related("team").filter(prefix=prefix).first()
    if not found:
        raise ApiError(404, f"No API key {prefix!r}.", param="prefix", code="key_not_found")
    return found


def team_named(name: str) -> Team:
    found = storable(name) and Team.objects.filter(name=name).first()
    if not found:
        raise ApiError(404, f"No team named {name!r}.", param="name", code="team_not_found")
    return found


def in_team(rows: QuerySet, team: str | None, field: str = "team") -> QuerySet:
    """`?team=research`: the rows of that team's keys (404 for no such team); `?team=`: of
    keys in no team; no `team`: all."""
    if team is None:
        return rows
    return rows.filter(**{field: team_named(team) if team else None})


def changed(data: dict) -> str:
    """What a change set, for the log: `revoked=True, team=None`."""
    return ", ".join(f"{k}={v!r}" for k, v in data.items())


def checked(serializer: serializers.Serializer) -> serializers.Serializer:
    serializer.is_valid(raise_exception=True)
    return serializer


class KeyList(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="List API keys (operators)",
        parameters=[
            *listing.page_parameters(listing.MAX_LIMIT),
            OpenApiParameter("team", str, description="Only its keys; empty: keys in no team."),
        ],
        responses={200: KeyListOut, **ERRORS},
    )
    def get(self, request: DrfRequest) -> Response:
        operator_of(request)
        rows = in_team(ApiKey.objects.select_related("team"), request.query_params.get("team"))
        order = ("name", "prefix")
        return Response(
            listing.page(rows, request.query_params, order, keys_body, listing.MAX_LIMIT)
        )

    @extend_schema(
        summary="Create an API key (operators); its secret is in this answer only",
        request=KeySerializer,
        responses={201: NewKeyOut, **ERRORS},
    )
    def post(self, request: DrfRequest) -> Response:
        caller = operator_of(request)
        data = checked(KeySerializer(data=request.data)).validated_data
        api_key, secret = ApiKey.generate(data.pop("name"), **data)
        api_key.save()
        log.info("API key %s created by %s", api_key, caller.name)
        body = keys_body([api_key])[0]
        body.update(key=secret, webhook_secret=api_key.webhook_secret)
        return Response(body, status=201)


class KeyDetail(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(summary="One API key (operators)", responses={200: KeySerializer, **ERRORS})
    def get(self, request: DrfRequest, prefix: str) -> Response:
        operator_of(request)
        return Response(keys_body([key_named(prefix)])[0])

    @extend_schema(
        summary="Change an API key: limits, team, revoked (operators)",
        request=KeySerializer,
        responses={200: KeySerializer, **ERRORS, **NOT_FOUND},
    )
    def patch(self, request: DrfRequest, prefix: str) -> Response:
        caller = operator_of(request)
        found = key_named(prefix)
        checked(KeySerializer(found, data=request.data, partial=True)).save()
        log.info("API key %s changed by %s: %s", found, caller.name, changed(request.data))
        return Response(keys_body([key_named(prefix)])[0])


class WebhookSecretOut(serializers.Serializer):
    webhook_secret = serializers.CharField(help_text="The new secret: shown this once.")


class RotateWebhookSecret(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="Give a key a new webhook secret, shown once; the old one signs nothing more"
        " (operators)",
        request=None,
        responses={200: WebhookSecretOut, **ERRORS, **NOT_FOUND},
    )
    def post(self, request: DrfRequest, prefix: str) -> Response:
        caller = operator_of(request)
        found = key_named(prefix)
        secret = found.rotate_webhook_secret()
        log.info("webhook secret of API key %s rotated by %s", found, caller.name)
        return Response({"webhook_secret": secret})


class TeamList(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="List teams (operators)",
        parameters=listing.page_parameters(listing.MAX_LIMIT),
        responses={200: TeamListOut, **ERRORS},
    )
    def get(self, request: DrfRequest) -> Response:
        operator_of(request)
        return Response(
            listing.page(
                Team.objects.all(), request.query_params, ("name",), teams_body, listing.MAX_LIMIT
            )
        )

    @extend_schema(
        summary="Create a team (operators)",
        request=TeamSerializer,
        responses={201: TeamSerializer, **ERRORS},
    )
    def post(self, request: DrfRequest) -> Response:
        caller = operator_of(request)
        team = checked(TeamSerializer(data=request.data)).save()
        log.info("team %s created by %s", team, caller.name)
        return Response(teams_body([team])[0], status=201)


class TeamDetail(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(summary="One team (operators)", responses={200: TeamSerializer, **ERRORS})
    def get(self, request: DrfRequest, name: str) -> Response:
        operator_of(request)
        return Response(teams_body([team_named(name)])[0])

    @extend_schema(
        summary="Change a team's share and quotas (operators)",
        request=TeamSerializer,
        responses={200: TeamSerializer, **ERRORS, **NOT_FOUND},
    )
    def patch(self, request: DrfRequest, name: str) -> Response:
        caller = operator_of(request)
        team = checked(TeamSerializer(team_named(name), data=request.data, partial=True)).save()
        log.info("team %s changed by %s: %s", team, caller.name, changed(request.data))
        return Response(teams_body([team])[0])

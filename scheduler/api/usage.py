"""The operator API's usage report: what keys and teams used, day by day (UTC), for a
report or a bill. `GET /api/v1/usage`; the callers of the servers' operator API (staff or
an operator key). `manage.py usage_report` prints the same."""

import csv
import io
from datetime import date, timedelta
from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from access import usage

from . import listing
from .callers import StaffSession, operator_of
from .keys import ERRORS, key_named, team_named

DEFAULT_DAYS = 30
MAX_DAYS = 366


class UsageRow(serializers.Serializer):
    key = serializers.CharField(required=False, help_text="The key's prefix (by key).")
    key_name = serializers.CharField(required=False)
    team = serializers.CharField(
        required=False, allow_null=True, help_text="By team (or key): its team; null: none."
    )
    day = serializers.DateField(required=False, help_text="By day: the UTC day.")
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    processing_s = serializers.FloatField()


class UsageReport(serializers.Serializer):
    since = serializers.DateField()
    until = serializers.DateField()
    by = serializers.ListField(child=serializers.CharField())
    data = UsageRow(many=True)
    total = UsageRow()


def day_param(params, name: str, default: date) -> date:
    value = params.get(name)
    if not value:
        return default
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise listing.bad(name, f"{name} must be a date, as 2026-11-01") from None


def parse(params) -> tuple[date, date, tuple[str, ...]]:
    today = timezone.now().date()
    until = day_param(params, "until", today)
    since = day_param(params, "since", until - timedelta(days=DEFAULT_DAYS - 1))
    if since > until:
        raise listing.bad("since", "since must not be after until")
    if (until - since).days >= MAX_DAYS:
        raise listing.bad("since", f"a report covers at most {MAX_DAYS} days")
    asked = set((params.get("by") or "key").split(","))
    if unknown := asked - set(usage.GROUPS):
        raise listing.bad("by", f"cannot group by {sorted(unknown)[0]!r}; by key, team and/or day")
    return since, until, tuple(name for name in usage.GROUPS if name in asked)


def columns(by: tuple[str, ...]) -> list[str]:
    """A report's columns: what it is grouped by (a key with its name), then the figures."""
    grouped = [*by[:1], "key_name", *by[1:]] if "key" in by else list(by)
    return [*grouped, *usage.FIELDS]


def csv_text(rows: list[dict[str, Any]], by: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns(by), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def report(params) -> tuple[list[dict[str, Any]], dict[str, Any], tuple[str, ...]]:
    """The rows, their total and the grouping `params` ask for (`since`, `until`, `by`,
    `key`, `team`); a bad one raises ApiError naming it."""
    since, until, by = parse(params)
    key = key_named(params["key"]) if params.get("key") else None
    team = team_named(params["team"]) if params.get("team") else None
    rows = usage.report(
        since, until, by, api_key_id=key.pk if key else None, team_id=team.pk if team else None
    )
    for row in rows:
        row["processing_s"] = round(row["processing_s"], 3)
    total = {name: sum(row[name] for row in rows) for name in usage.FIELDS}
    total["processing_s"] = round(total["processing_s"], 3)
    head = {"since": since, "until": until, "by": list(by)}
    return rows, head | {"total": total}, by


class Usage(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="What keys and teams used, by key, team and/or day (operators)",
        parameters=[
            OpenApiParameter("since", str, description="First UTC day (30 days before until)"),
            OpenApiParameter("until", str, description="Last UTC day, included (today)"),
            OpenApiParameter(
                "by", str, description="key (default), team, day, or several: team,day"
            ),
            OpenApiParameter("key", str, description="Only this key's (a prefix)"),
            OpenApiParameter("team", str, description="Only this team's keys'"),
            OpenApiParameter("as", str, enum=["json", "csv"], description="csv: a CSV file"),
        ],
        responses={200: UsageReport, **ERRORS},
    )
    def get(self, request: DrfRequest) -> Response | HttpResponse:
        operator_of(request)
        rows, summary, by = report(request.query_params)
        if request.query_params.get("as") == "csv":
            return HttpResponse(csv_text(rows, by), content_type="text/csv; charset=utf-8")
        return Response({**summary, "data": rows})

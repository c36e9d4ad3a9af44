"""The operator API for the configuration file: `POST /api/v1/config` applies a file's
servers, models, deployments and teams as `manage.py apply_config` does (YAML, JSON or TOML
by its content type; `?dry_run=true` says what would change and changes nothing), and
`GET /api/v1/config` answers what is configured now in the file's shape (`?as=yaml` as
a file), which applied again changes nothing."""

import logging

import yaml
from django.db import transaction
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from backends.config_file import ConfigError, apply, export, parse

from .callers import StaffSession, operator_of
from .errors import ApiError
from .fields import check_text

log = logging.getLogger(__name__)


class AppliedOut(serializers.Serializer):
    dry_run = serializers.BooleanField()
    changed = serializers.BooleanField()
    created = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    deleted = serializers.ListField(
        child=serializers.CharField(), help_text="With prune: what the file left out, deleted."
    )


def body_format(content_type: str) -> str:
    """TOML by its media type; anything else is read as YAML, of which JSON is a part."""
    return "toml" if "toml" in content_type else "yaml"


class Config(APIView):
    authentication_classes = [StaffSession]
    parser_classes: list = []  # the body is read whole, as the file it is

    @extend_schema(
        summary="What is configured now, in the configuration file's shape (operators)",
        parameters=[
            OpenApiParameter("as", str, enum=["json", "yaml"], description="yaml: as a file")
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: DrfRequest) -> Response | HttpResponse:
        operator_of(request)
        data = export()
        if request.query_params.get("as") == "yaml":
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
            return HttpResponse(text, content_type="application/yaml; charset=utf-8")
        return Response(data)

    @extend_schema(
        summary="Apply a configuration file: servers, models, deployments, teams (operators)",
        parameters=[
            OpenApiParameter(
                "dry_run", bool, description="Say what would change, and change nothing."
            ),
            OpenApiParameter(
                "prune",
                bool,
                description="Also delete what the file's lists leave out (servers, models,"
                " teams; deployments of a server that lists them).",
            ),
        ],
        request={
            "application/yaml": OpenApiTypes.STR,
            "application/json": OpenApiTypes.OBJECT,
            "application/toml": OpenApiTypes.STR,
        },
        responses={
            200: AppliedOut,
            400: OpenApiResponse(description="The file has a problem: nothing changed"),
        },
    )
    def post(self, request: DrfRequest) -> Response:
        caller = operator_of(request)
        dry_run, prune = (
            request.query_params.get(flag, "").lower() in ("1", "true", "yes")
            for flag in ("dry_run", "prune")
        )
        try:
            text = request.body.decode()
            data = parse(text, body_format(request.content_type or ""))
            check_text(data)  # a YAML escape can make what the database cannot keep
            with transaction.atomic():
                summary = apply(data, prune=prune)
                if dry_run:
                    transaction.set_rollback(True)
        except UnicodeDecodeError:
            raise ApiError(400, "The body is not UTF-8 text.", code="invalid_config") from None
        except ConfigError as error:
            raise ApiError(400, str(error), code="invalid_config") from None
        if summary.changed and not dry_run:
            log.info("configuration applied by %s: %s", caller.name, summary)
        return Response(
            {
                "dry_run": dry_run,
                "changed": summary.changed,
                "created": summary.created,
                "updated": summary.updated,
                "deleted": summary.deleted,
            }
        )

"""The operator API: the servers as the scheduler sees them, and intents for them.

`GET /api/v1/servers` lists each server with its health, slots in use and deployments.
`POST /api/v1/servers/{name}/load|unload|drain|enable` records an intent: a worker's loop
carries it out like its own decisions (see scheduler.intents), never around them. The
answer is 202 with the intent, followed at `GET /api/v1/intents/{id}`
(`scheduler.api.intents`); `GET /api/v1/servers/{name}` is one server of the listing. `POST
/api/v1/servers/{name}/sync` asks the server what it has at once and adds what Switchyard
does not know (discovery, `backends.discovery`); `GET /api/v1/servers/{name}/check` says
whether it is set up as Switchyard needs it (`backends.checkup`)."""

import logging
from typing import Any

from django.db.models import Count
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request as DrfRequest
from rest_framework.response import Response
from rest_framework.views import APIView

from backends.checkup import check_server
from backends.discovery import sync_server
from backends.models import Deployment, Server

from ..asking import ask_load, ask_unload, record
from ..durations import to_ms
from ..intents import open_intents
from ..models import Intent, Request, State
from . import listing
from .callers import OPERATOR_REFUSALS, StaffSession, operator_of
from .errors import ApiError
from .intake import find_model
from .intents import IntentOut, intent_body, intent_url, intents
from .strict import Strict

log = logging.getLogger(__name__)


class DeploymentOut(serializers.Serializer):
    model = serializers.CharField()
    state = serializers.CharField()
    load_progress = serializers.FloatField(allow_null=True)
    loaded_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    in_flight = serializers.IntegerField()
    slots = serializers.IntegerField(
        allow_null=True,
        help_text="Requests of this model the server serves at once (null: the server's slots).",
    )
    load_overrides = serializers.DictField(
        help_text="The options the load in place or under way was asked with (an operator's"
        " load), over the deployment's own load options."
    )
    enabled = serializers.BooleanField(
        help_text="False: an operator disabled it; nothing is sent to it or loads it."
    )
    pinned = serializers.BooleanField()
    keep_loaded_hours = serializers.CharField(
        help_text="When it is kept loaded, in SWITCHYARD_TIME_ZONE (empty: never)."
    )
    preload = serializers.BooleanField(
        help_text="Loaded when a worker starts and when its server is back."
    )
    idle_ttl_s = serializers.IntegerField(
        allow_null=True, help_text="Unloaded after this long unused (null: kept until evicted)."
    )
    load_cause = serializers.CharField(
        help_text="Who asked for its last load: request, restore, preload, operator or outside"
        " (loaded on the server by someone else); empty before one."
    )
    avg_load_s = serializers.FloatField(
        allow_null=True, help_text="Its loads here, measured (a moving average; null before one)."
    )
    expected_load_s = serializers.IntegerField(
        allow_null=True,
        help_text="What its operator says a load here takes, expected until one is measured.",
    )
    avg_inference_s = serializers.FloatField(
        allow_null=True, help_text="Its requests' runs here, measured (a moving average)."
    )
    last_error = serializers.CharField()


class ServerOut(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField()
    enabled = serializers.BooleanField()
    health = serializers.CharField()
    slots = serializers.IntegerField()
    slots_in_use = serializers.IntegerField()
    room = serializers.DictField(
        child=serializers.IntegerField(allow_null=True),
        help_text="Models it may hold at once: of each type (llm, embedding, reranking) and"
        " in all (null: no count in all; a router's --models-max, as a worker learnt it).",
    )
    requests_in_flight = serializers.IntegerField()
    last_seen = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()
    cooldown_until = serializers.DateTimeField(allow_null=True)
    deployments = DeploymentOut(many=True)
    intents = IntentOut(many=True, help_text="Intents not yet finished, oldest first.")


ServerListOut = listing.page_schema("ServerList", ServerOut(many=True))


class LoadIn(Strict, serializers.Serializer):
    model = serializers.CharField(help_text="The model's name or alias.")
    options = serializers.DictField(
        required=False,
        help_text="Options for this load only, over the deployment's own load options"
        " (which stay as they are).",
    )


class UnloadIn(Strict, serializers.Serializer):
    model = serializers.CharField(help_text="The model's name or alias.")
    force = serializers.BooleanField(
        default=True,
        help_text="True: a busy model is unloaded once its requests finish. False: 409.",
    )


def servers_page(params) -> dict[str, Any]:
    """A page of servers by name (all of them, up to 100, unless `limit` says fewer)."""
    return listing.page(
        Server.objects.all(), params, ("name",), servers_body, default_limit=listing.MAX_LIMIT
    )


def servers_body(servers: list[Server]) -> list[dict[str, Any]]:
    """What the listing shows of each of these servers."""
    ids = [s.pk for s in servers]
    busy = dict(
        Request.objects.filter(state=State.PROCESSING, server_id__in=ids)
        .values_list("server_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    deployments: dict[int, list[dict]] = {}
    for d in (
        Deployment.objects.filter(server_id__in=ids).select_related("model").order_by("model__name")
    ):
        deployments.setdefault(d.server_id, []).append(
            {
                "model": d.model.name,
                "state": d.state,
                "load_progress": d.load_progress,
                "loaded_at": d.loaded_at,
                "last_used_at": d.last_used_at,
                "in_flight": d.in_flight,
                "slots": d.slots,
                "load_overrides": d.load_overrides,
                "enabled": d.enabled,
                "pinned": d.pinned,
                "keep_loaded_hours": d.keep_loaded_hours,
                "preload": d.preload,
                "idle_ttl_s": d.idle_ttl_s,
                "load_cause": d.load_cause,
                "avg_load_s": to_ms(d.avg_load_s),
                "expected_load_s": d.expected_load_s,
                "avg_inference_s": to_ms(d.avg_inference_s),
                "last_error": d.last_error,
            }
        )
    unfinished: dict[int, list[dict]] = {}
    for intent in intents(open_intents().filter(server_id__in=ids)):
        unfinished.setdefault(intent.server_id, []).append(intent_body(intent))
    data = []
    for s in servers:
        in_flight = busy.get(s.pk, 0)
        data.append(
            {
                "name": s.name,
                "kind": s.kind,
                "enabled": s.enabled,
                "health": s.health,
                "slots": s.slots,
                "slots_in_use": min(in_flight, s.slots),
                "room": {**s.room, "in_all": s.max_models},
                "requests_in_flight": in_flight,
                "last_seen": s.last_seen,
                "last_error": s.last_error,
                "cooldown_until": s.cooldown_until,
                "deployments": deployments.get(s.pk, []),
                "intents": unfinished.get(s.pk, []),
            }
        )
    return data


ERRORS = {
    **OPERATOR_REFUSALS,
    404: OpenApiResponse(description="No such server or deployment, or the model not loaded"),
}


class ServerDetail(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="One server, as the list shows it (operators)",
        responses={
            200: ServerOut,
            **ERRORS,
            404: OpenApiResponse(description="No such server"),
        },
    )
    def get(self, request: DrfRequest, name: str) -> Response:
        operator_of(request)
        return Response(servers_body([server_named(name)])[0])


class ServerList(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="List servers (operators)",
        parameters=listing.page_parameters(listing.MAX_LIMIT),
        responses={
            200: ServerListOut,
            **OPERATOR_REFUSALS,
        },
    )
    def get(self, request: DrfRequest) -> Response:
        operator_of(request)
        return Response(servers_page(request.query_params))


def server_named(name: str) -> Server:
    found = Server.objects.filter(name=name).first()
    if found is None:
        raise ApiError(404, f"No server named {name!r}.", param="name", code="server_not_found")
    return found


def deployment_of(server: Server, name: str) -> Deployment:
    model = find_model(name)
    found = model and Deployment.objects.filter(server=server, model=model).first()
    if not found:
        raise ApiError(
            404,
            f"Server {server.name} has no deployment of a model {name!r}.",
            param="model",
            code="model_not_deployed",
        )
    found.server, found.model = server, model  # read already: its name and its intent's
    return found


def valid(serializer_class, data) -> dict[str, Any]:
    checked = serializer_class(data=data)
    checked.is_valid(raise_exception=True)
    return checked.validated_data


def asked_load(server: Server, data: dict, by: str) -> Intent:
    return ask_load(deployment_of(server, data["model"]), by, data.get("options"))


def asked_unload(server: Server, data: dict, by: str) -> Intent:
    return ask_unload(deployment_of(server, data["model"]), by, data["force"])


class ServerAction(APIView):
    """One of the four intents; `action` and `shape` are set by each subclass."""

    authentication_classes = [StaffSession]
    action = ""
    shape: type[serializers.Serializer] | None = None

    def ask(self, server: Server, data: dict, by: str) -> Intent:
        return record(server, self.action, by)

    def post(self, request: DrfRequest, name: str) -> Response:
        caller = operator_of(request)
        data = valid(self.shape, request.data) if self.shape else {}
        intent = intents().get(pk=self.ask(server_named(name), data, caller.name).pk)
        return Response(
            intent_body(intent), status=202, headers={"Location": intent_url(intent.pk)}
        )


class LoadServer(ServerAction):
    action, shape = Intent.Action.LOAD, LoadIn

    def ask(self, server: Server, data: dict, by: str) -> Intent:
        return asked_load(server, data, by)

    @extend_schema(
        summary="Load a model on a server (operators)",
        request=LoadIn,
        responses={202: IntentOut, **ERRORS, 409: OpenApiResponse(description="Loaded or loading")},
    )
    def post(self, request: DrfRequest, name: str) -> Response:
        return super().post(request, name)


class UnloadServer(ServerAction):
    action, shape = Intent.Action.UNLOAD, UnloadIn

    def ask(self, server: Server, data: dict, by: str) -> Intent:
        return asked_unload(server, data, by)

    @extend_schema(
        summary="Unload a model from a server (operators)",
        request=UnloadIn,
        responses={202: IntentOut, **ERRORS, 409: OpenApiResponse(description="Busy, force false")},
    )
    def post(self, request: DrfRequest, name: str) -> Response:
        return super().post(request, name)


class DrainServer(ServerAction):
    action = Intent.Action.DRAIN

    @extend_schema(
        summary="Drain a server: no new work; what runs there finishes (operators)",
        request=None,
        responses={202: IntentOut, **ERRORS},
    )
    def post(self, request: DrfRequest, name: str) -> Response:
        return super().post(request, name)


class EnableServer(ServerAction):
    action = Intent.Action.ENABLE

    @extend_schema(
        summary="Enable a server again (operators)",
        request=None,
        responses={202: IntentOut, **ERRORS},
    )
    def post(self, request: DrfRequest, name: str) -> Response:
        return super().post(request, name)


class SyncOut(serializers.Serializer):
    server = serializers.CharField()
    listed = serializers.IntegerField(help_text="Models the server lists.")
    created_models = serializers.ListField(child=serializers.CharField())
    created_deployments = serializers.ListField(child=serializers.CharField())
    filled = serializers.ListField(
        child=serializers.CharField(), help_text="Empty facts filled: size, slots, capabilities."
    )
    skipped = serializers.ListField(child=serializers.CharField())
    not_listed = serializers.ListField(
        child=serializers.CharField(), help_text="Deployments whose name the server does not list."
    )


class SyncServer(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="Add the models a server lists (discovery, as `sync_models`) (operators)",
        request=None,
        responses={
            200: SyncOut,
            **ERRORS,
            502: OpenApiResponse(description="The server could not be asked"),
        },
    )
    def post(self, request: DrfRequest, name: str) -> Response:
        caller = operator_of(request)
        report = sync_server(server_named(name))
        if report.error:
            raise ApiError(
                502, f"{name} could not list its models: {report.error}", code="server_unreachable"
            )
        log.info("models of %s synced by %s: %s", name, caller.name, report)
        return Response(SyncOut(report).data)


class FindingOut(serializers.Serializer):
    level = serializers.ChoiceField(choices=["ok", "warning", "error"])
    text = serializers.CharField()


class CheckOut(serializers.Serializer):
    server = serializers.CharField()
    worst = serializers.CharField(help_text="The worst level of its findings.")
    findings = FindingOut(many=True)


class CheckServer(APIView):
    authentication_classes = [StaffSession]

    @extend_schema(
        summary="Is a server set up as Switchyard needs it? (as `check_servers`) (operators)",
        responses={200: CheckOut, **ERRORS},
    )
    def get(self, request: DrfRequest, name: str) -> Response:
        operator_of(request)
        report = check_server(server_named(name))
        return Response(CheckOut({**vars(report), "worst": report.worst}).data)

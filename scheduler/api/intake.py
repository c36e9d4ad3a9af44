"""Accepting a request: validate, resolve the model, check the queue bound, store it.

A rejected request stores nothing."""

import math
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from access import limits
from access.models import ApiKey
from backends.models import Model, ModelType

from .. import sql, wakeup, webhooks
from ..models import WAITING_STATES, Priority, Request, RequestKind, State, Trace
from . import affinity, fields
from .errors import ApiError
from .idempotency import Claim, claim_in_transaction
from .queue_bound import queue_bound

MODEL_NAME_MAX = Request._meta.get_field("model_name").max_length  # a Model's name's too
PRIORITY_NAMES = {p.label: p.value for p in Priority}
# The model types each kind of request can be served by.
SERVED_BY = {
    RequestKind.CHAT: (ModelType.LLM,),
    RequestKind.COMPLETION: (ModelType.LLM,),
    RequestKind.EMBEDDING: (ModelType.EMBEDDING,),
    RequestKind.RERANK: (ModelType.RERANKING,),
    RequestKind.RESPONSE: (ModelType.LLM,),
    RequestKind.MESSAGE: (ModelType.LLM,),
    RequestKind.COUNT_TOKENS: (ModelType.LLM,),
}
REQUIRED_INPUT = {
    RequestKind.CHAT: "messages",
    RequestKind.COMPLETION: "prompt",
    RequestKind.EMBEDDING: "input",
    RequestKind.RERANK: "query",
    RequestKind.RESPONSE: "input",
    RequestKind.MESSAGE: "messages",
    RequestKind.COUNT_TOKENS: "messages",
}
IMAGE_KINDS = (
    RequestKind.CHAT,
    RequestKind.MESSAGE,
    RequestKind.RESPONSE,
    RequestKind.COUNT_TOKENS,
)
IMAGE_PARTS = ("image_url", "image", "input_image")
NEVER_STREAMED = (RequestKind.EMBEDDING, RequestKind.RERANK, RequestKind.COUNT_TOKENS)


def find_model(name: str) -> Model | None:
    """The model called `name`, or else the one that has it among its aliases."""
    models = list(Model.objects.all())
    return next((m for m in models if m.name == name), None) or next(
        (m for m in models if name in (m.aliases or [])), None
    )


def resolve(name: str, kind: str) -> Model:
    """The model called `name` (or that has it among its aliases), if it serves `kind`."""
    model = find_model(name)
    if model is None:
        raise model_not_found(name)
    if model.type not in SERVED_BY[kind]:
        raise ApiError(
            400,
            f"The model `{name}` is of type {model.type}; {kind} requests need a model of"
            f" type {' or '.join(SERVED_BY[kind])}.",
            param="model",
            code="model_type_mismatch",
        )
    return model


def model_not_found(name: str) -> ApiError:
    return ApiError(
        404, f"The model `{name}` does not exist.", param="model", code="model_not_found"
    )


def carries_images(kind: str, body: dict[str, Any]) -> bool:
    """Whether a message (or a response's input item) has an image part: OpenAI's
    `image_url`, Anthropic's `image`, the Responses API's `input_image`."""
    items = body.get(REQUIRED_INPUT[kind]) if kind in IMAGE_KINDS else None
    if not isinstance(items, list):
        return False
    return any(
        isinstance(part, dict) and part.get("type") in IMAGE_PARTS
        for item in items
        if isinstance(item, dict) and isinstance(item.get("content"), list)
        for part in item["content"]
    )


def check_takes_images(name: str, param: str) -> None:
    """Images for a model known to take none are refused before anything is stored: else
    the request could wait for a load, only for the server to refuse it."""
    model = find_model(name)
    if model is None or model.capabilities is None or "vision" in model.capabilities:
        return  # unknown (its server decides), or it takes them
    takes = ", ".join(model.capabilities) or "text only"
    raise ApiError(
        400,
        f"The model `{name}` does not take images (it takes {takes}); send them to a model"
        " with vision among its capabilities (GET /v1/models lists them).",
        param=param,
        code="images_not_supported",
    )


def names_of(name: str) -> list[str]:
    """The names of the model called `name` or that has it as an alias ([] if none)."""
    model = Model.objects.filter(name=name).first() or next(
        (m for m in Model.objects.all() if name in (m.aliases or [])), None
    )
    return model.names if model else []


def parse_priority(value: Any) -> int | None:
    """The class asked for; None if none was."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.lower() in PRIORITY_NAMES:
        return PRIORITY_NAMES[value.lower()]
    raise ApiError(
        400,
        f"priority must be one of {', '.join(PRIORITY_NAMES)}; got {value!r}",
        param="priority",
        code="invalid_priority",
    )


def validate_body(kind: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise fields.invalid_type("model", "model must be a string, the model's name")
    if not model:
        raise ApiError(400, "you must provide a model parameter", param="model", code="missing")
    field = REQUIRED_INPUT[kind]
    value = body.get(field)
    chat = kind in (RequestKind.CHAT, RequestKind.MESSAGE)
    if chat and value is not None and not isinstance(value, list):
        raise fields.invalid_type(field, "messages must be an array of messages")
    if value is None or value == "" or value == []:
        article = "an" if field[0] in "aeiou" else "a"
        message = f"you must provide {article} {field} parameter"
        if chat:
            message = "messages must be a non-empty array"
        raise ApiError(400, message, param=field, code="missing")
    fields.check(kind, body)
    return body


def max_wait_s(priority: int) -> float:
    return settings.SWITCHYARD[f"MAX_WAIT_{Priority(priority).label.upper()}_S"]


def accept(
    kind: str,
    body: Any,
    priority: Any = None,
    request_id=None,
    *,
    caller_waits: bool = False,
    api_key: ApiKey | None = None,
    callback_url: str = "",
    idempotency: Claim | None = None,
    no_server_grace_s: float | None = None,
    max_wait: float | None = None,
) -> Request:
    """Validate and store a new request (under the caller's `idempotency` key, if any).
    Raises ApiError (and stores nothing) on bad input.

    A caller that waits on the open connection (`caller_waits`) is answered when the request
    ends, and told so (`request_lost`) should a database crash lose the row before then;
    after, it has its answer. So its insert may skip the disk's flush (only with
    `SWITCHYARD_SKIP_FLUSH` on; by default it waits). A job's id is a promise made at
    once: its insert always waits."""
    body = dict(validate_body(kind, body))
    if len(body["model"]) > MODEL_NAME_MAX:  # no model's, nor a name a request can keep
        raise model_not_found(body["model"])
    body_priority = body.pop("priority", None)
    asked = parse_priority(priority if priority not in (None, "") else body_priority)
    level, capped = limits.capped_priority(api_key, asked, Priority.NORMAL)
    limits.check_model(api_key, body["model"], names_of)
    if carries_images(kind, body):
        check_takes_images(body["model"], REQUIRED_INPUT[kind])
    longest = check_max_wait(max_wait) if max_wait is not None else max_wait_s(level)
    check_grace(no_server_grace_s, level, longest)
    stream = bool(body.get("stream", False)) and kind not in NEVER_STREAMED
    fields = {"id": request_id} if request_id else {}
    conversation, cache_server = affinity.of(kind, body)
    request = Request(
        kind=kind,
        model_name=body["model"],
        payload=body,
        stream=stream,
        priority=level,
        api_key=api_key,
        callback_url=callback_url,
        no_server_grace_s=no_server_grace_s,
        affinity_key=conversation,
        cache_server_id=cache_server,
        **fields,
    )
    request.idempotency = idempotency
    request.longest_wait_s = longest  # not a column: its expiry is written from it
    # The model's id is looked up by the insert itself: a round trip less. A name that no
    # model has stores nothing, and is then looked up among the aliases.
    if not store(request, caller_waits, body["model"], by_name=True, note=capped):
        queue_bound.withdraw(level)
        model = resolve(body["model"], kind)
        request.model_id = model.pk
        store(request, caller_waits, model.name, by_name=False, note=capped)
    return request


def check_max_wait(wait_s: float) -> float:
    """A job's own longest wait: more than 0, at most SWITCHYARD_MAX_JOB_WAIT_S."""
    most = settings.SWITCHYARD["MAX_JOB_WAIT_S"]
    if not math.isfinite(wait_s) or not 0 < wait_s <= most:
        raise ApiError(
            400,
            f"max_wait_s must be more than 0 and at most {most:g} s (SWITCHYARD_MAX_JOB_WAIT_S)",
            param="max_wait_s",
            code="invalid_value",
        )
    return wait_s


def check_grace(grace_s: float | None, priority: int, longest: float) -> None:
    """A job's own no-server grace: at most its longest wait (it expires then)."""
    if grace_s is None:
        return
    if not math.isfinite(grace_s) or not 0 <= grace_s <= longest:
        raise ApiError(
            400,
            f"no_server_grace_s must be from 0 to {longest:g} s (the longest this"
            f" {Priority(priority).label} request waits)",
            param="no_server_grace_s",
            code="invalid_value",
        )


def store(request: Request, caller_waits: bool, model: str, by_name: bool, note: str = "") -> bool:
    """Insert the request and wake the workers on commit, telling them its `model`'s name.
    With `by_name`, its model is the one of that name that serves its kind, found by the
    insert itself: False, and nothing stored (nor anyone woken), if none is."""
    found_by = ("model", "name", model, ("type", SERVED_BY[request.kind])) if by_name else None
    with sql.atomic():
        if caller_waits:
            sql.without_waiting_for_disk()
        request.rate_limits = limits.admit(request.api_key)  # not a column: its answer's headers
        queue_bound.admit(request.priority)
        # Stamped with the connection in hand, as near the commit as the row can tell.
        request.created_at = timezone.now()
        request.expires_at = request.created_at + timedelta(seconds=request.longest_wait_s)
        inserted = sql.insert(request, found_by)
        if note:  # the key's cap changed its class: its trace says so
            note_in_trace(request, note)
        if request.callback_url:
            webhooks.add_callback(request.id)
        if request.idempotency is not None:
            claim_in_transaction(request, request.idempotency)
        # A request under a processing quota is not sent on arrival (that skips the pass):
        # the pass, which counts what its key and team have processing, sends it.
        quota = request.api_key is not None and request.api_key.has_processing_quota()
        arrival = wakeup.Arrival(
            request.priority,
            request.id,
            "" if quota else model,
            request.api_key_id or 0,
            request.cache_server_id or 0,
        )
        wakeup.notify_in_transaction(arrival)

        def stored() -> bool:  # known once the insert is sent, with the commit
            return found_by is None or bool(inserted.rows)

        transaction.on_commit(lambda: stored() and wakeup.wake_local(arrival))
    if not stored():
        return False
    if found_by is not None:
        request.model_id = inserted.rows[0][0]
    return True


def note_in_trace(request: Request, note: str) -> None:
    """A trace row for the request as it is stored, written with its insert."""
    values = [
        sql.db_value(Request, "id", request.id),
        sql.db_value(Trace, "at", request.created_at),
        State.PENDING,
        note,
    ]
    sql.write_later(
        sql.prepared(
            f"INSERT INTO {Trace._meta.db_table} (request_id, at, from_state, to_state, server,"
            " reason) VALUES (%s, %s, '', %s, '', %s)"
        ),
        values,
    )


def position_in_line(request: Request) -> int | None:
    """1-based place among waiting requests, by class then arrival; None once not waiting."""
    if request.state not in WAITING_STATES:
        return None
    ahead = Request.objects.filter(state__in=WAITING_STATES, priority__lt=request.priority).count()
    ahead += Request.objects.filter(
        state__in=WAITING_STATES, priority=request.priority, created_at__lt=request.created_at
    ).count()
    return ahead + 1

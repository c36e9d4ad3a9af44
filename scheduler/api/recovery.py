"""Storing a request across a database fault, without ever running it twice.

The insert and its COMMIT travel together (scheduler/sql.py), so a fault on that round trip
leaves it unknown whether the row was stored. The request's id is chosen before the insert:
once the pool has dropped its dead connections, one read tells. Stored: the caller is
answered as usual. Not stored: the insert goes once more. Unreadable: the caller learns the
id and where to poll (`request_state_unknown`), never a bare 500. Only a fault before
anything was sent (no connection to be had) is a plain 503 `unavailable`."""

import functools
import logging
import uuid
from typing import Any

from django.db import connection

from access.models import ApiKey

from .. import faults
from ..models import Request
from . import intake
from .errors import ApiError
from .idempotency import Claim
from .waiting import state_unknown

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1


def unavailable(service: str) -> ApiError:
    """Nothing was stored: the caller may simply send it again."""
    return ApiError(
        503,
        f"{service} is not answering; nothing was stored. Send the request again.",
        type="server_error",
        code="unavailable",
        retry_after_s=RETRY_AFTER_S,
    )


def connect() -> None:
    """A connection before anything is sent: failing here, nothing was stored."""
    try:
        connection.ensure_connection()
    except faults.DATABASE_FAULTS as exc:
        faults.check_pool()
        raise unavailable("The database") from exc


def accept(
    kind: str,
    body: Any,
    priority: Any = None,
    request_id: uuid.UUID | None = None,
    *,
    caller_waits: bool = False,
    api_key: ApiKey | None = None,
    idempotency: Claim | None = None,
    callback_url: str = "",
    no_server_grace_s: float | None = None,
    max_wait: float | None = None,
) -> Request:
    """`intake.accept`, across one database fault (see the module's docstring)."""
    request_id = request_id or uuid.uuid4()
    options = {
        "caller_waits": caller_waits,
        "api_key": api_key,
        "idempotency": idempotency,
        "callback_url": callback_url,
        "no_server_grace_s": no_server_grace_s,
        "max_wait": max_wait,
    }
    store = functools.partial(intake.accept, kind, body, priority, request_id, **options)
    connect()
    try:
        return store()
    except faults.DATABASE_FAULTS as exc:
        log.warning("storing request %s hit a database fault: %s", request_id, exc)
        faults.check_pool()
    try:
        found = Request.objects.filter(pk=request_id).first()
    except faults.DATABASE_FAULTS as exc:
        faults.check_pool()
        raise state_unknown(request_id) from exc
    if found is not None:
        log.info("request %s was stored despite the fault; going on", request_id)
        return found
    connect()
    try:
        return store()
    except faults.DATABASE_FAULTS as exc:
        faults.check_pool()
        raise state_unknown(request_id) from exc

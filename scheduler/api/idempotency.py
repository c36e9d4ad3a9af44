"""Idempotency-Key: a retry with the same key (per API key, kept KEEP for 24 h) gets the
request the first call stored, never a second one. The key is written in the transaction
that stores its request (`claim_in_transaction`), and a unique constraint settles two
calls that race: the loser finds the winner's request."""

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from access.models import ApiKey

from .. import sql
from ..models import IdempotencyKey, Request
from .errors import ApiError

HEADER = "Idempotency-Key"
KEEP = timedelta(hours=24)
MAX_LENGTH = IdempotencyKey._meta.get_field("key").max_length


@dataclass(frozen=True)
class Claim:
    scope: str
    key: str

    def request(self) -> Request | None:
        """The request stored under this key within KEEP, if any (sync)."""
        found = (
            IdempotencyKey.objects.filter(
                scope=self.scope, key=self.key, created_at__gte=timezone.now() - KEEP
            )
            .values_list("request_id", flat=True)
            .first()
        )
        if found is None:
            return None
        return Request.objects.select_related("server").filter(pk=found).first()


def claim_of(value: str | None, api_key: ApiKey | None) -> Claim | None:
    """The caller's claim on its Idempotency-Key header (None without one)."""
    if value is None:
        return None
    if not value or len(value) > MAX_LENGTH or not value.isprintable():
        raise ApiError(
            400,
            f"{HEADER} must be 1 to {MAX_LENGTH} printable characters.",
            param=HEADER,
            code="invalid_idempotency_key",
        )
    return Claim("" if api_key is None else str(api_key.pk), value)


def claim_in_transaction(request: Request, claim: Claim) -> None:
    """Inside the transaction that stores `request`, after its insert: the key names it.
    (Nothing if the insert stored nothing; an expired claim of the same key gives way.)"""
    table, requests = IdempotencyKey._meta.db_table, Request._meta.db_table
    now = sql.db_value(IdempotencyKey, "created_at", timezone.now())
    sql.write_later(
        f"DELETE FROM {table} WHERE scope = %s AND key = %s AND created_at < %s",
        [claim.scope, claim.key, sql.db_value(IdempotencyKey, "created_at", timezone.now() - KEEP)],
    )
    request_id = sql.db_value(Request, "id", request.id)
    sql.write_later(
        f"INSERT INTO {table} (scope, key, request_id, created_at)"
        f" SELECT %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM {requests} WHERE id = %s)",
        [claim.scope, claim.key, request_id, now, request_id],
    )


def reused(request: Request, kind: str) -> ApiError | None:
    """An error if the key's request is of another kind than this call's."""
    if request.kind == kind:
        return None
    return ApiError(
        422,
        f"This {HEADER} was used for a {request.kind} request ({request.pk}); use a new key"
        " for a different request.",
        param=HEADER,
        code="idempotency_key_reused",
    )


def purge(before=None) -> int:
    """Forget keys older than KEEP."""
    cutoff = before or timezone.now() - KEEP
    return IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()[0]

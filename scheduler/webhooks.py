"""Job callbacks: when a request that carries a `callback_url` ends, a worker POSTs its final
state there, signed, and retries with backoff for a bounded time; every attempt is a trace
row of the request.

The callback's row is written with the request, in its transaction (`add_callback`), so an
accepted job's callback is never lost. A worker claims due callbacks (FOR UPDATE SKIP
LOCKED, and a lease in `next_at`): one worker sends each attempt. Delivery is at least once:
a worker that dies mid-send leaves its claim to expire, and the next one sends again; a
receiver tells repeats apart by `X-Switchyard-Request-Id`.

The body is the request as `GET /api/v1/requests/{id}` shows it. The signature header
`X-Switchyard-Signature: sha256=<hex>` is the HMAC-SHA256 of the exact body bytes with the
webhook secret of the API key that sent the job (read at each attempt, so a rotated secret
signs the attempts after it), or `SWITCHYARD_WEBHOOK_SECRET` for a job sent without a key
(`SWITCHYARD_AUTH=off`) or by a key that has none."""

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from . import faults, sql
from .models import TERMINAL_STATES, Callback, Request, Trace
from .pool_threads import in_pool_thread
from .retry import backoff_s

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)
CALLBACKS = Callback._meta.db_table
REQUESTS = Request._meta.db_table
CLAIMED_AT_ONCE = 20
LEASE_S = 30.0  # beyond the send's own timeout: a claim outlives any attempt
MIN_GAP_S = 0.25  # at most four looks a second while requests end


def add_callback(request_id) -> None:
    """In the transaction that stores the request: its callback's row, written only if the
    request's row is (its insert may find no model and store nothing)."""
    [key] = sql.keys(Request, [request_id])
    sql.write_later(
        f"INSERT INTO {CALLBACKS} (request_id, status, attempts, next_at, last_error)"
        f" SELECT %s, %s, 0, NULL, '' WHERE EXISTS (SELECT 1 FROM {REQUESTS} WHERE id = %s)",
        [key, Callback.Status.WAITING, key],
    )


def signature(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def secret_for(request: Request) -> str:
    """The secret a request's callback is signed with: its key's, else the global one."""
    api_key = request.api_key if request.api_key_id else None
    return signing_secret(api_key)


def signing_secret(api_key) -> str:
    """What a key's callbacks are signed with ('' if nothing: callbacks are off for it)."""
    return (api_key and api_key.webhook_secret) or settings.WEBHOOK_SECRET


@dataclass(frozen=True)
class Delivery:
    request_id: object
    url: str
    attempt: int  # 1 for the first
    body: bytes
    secret: str


def claim_due() -> list[Delivery]:
    """The callbacks due now whose requests have ended, claimed for one attempt each."""
    from .api.jobs import detail_body  # the body is what the API shows

    now = timezone.now()
    waiting = Callback.objects.filter(
        status=Callback.Status.WAITING, request__state__in=TERMINAL_STATES
    ).exclude(next_at__gt=now)
    # Looked at first without a transaction: on SQLite every transaction here takes the
    # database's write lock, and most looks find nothing.
    if not waiting.exists():
        return []
    with transaction.atomic():
        due = list(
            waiting.select_for_update(skip_locked=True, of=("self",))
            .select_related("request__api_key")
            .order_by("next_at")[:CLAIMED_AT_ONCE]
        )
        lease = now + timedelta(seconds=LEASE_S + settings.SWITCHYARD["WEBHOOK_TIMEOUT_S"])
        Callback.objects.filter(pk__in=[c.pk for c in due]).update(next_at=lease)
    return [
        Delivery(
            c.request_id,
            c.request.callback_url,
            c.attempts + 1,
            json.dumps(detail_body(c.request_id, None), cls=DjangoJSONEncoder).encode(),
            secret_for(c.request),
        )
        for c in due
    ]


def record(delivery: Delivery, error: str | None) -> float | None:
    """The attempt's outcome: delivered, retried later, or given up; a trace row each.
    Returns the seconds until the retry, if there is one."""
    knobs = settings.SWITCHYARD
    host = httpx.URL(delivery.url).host
    with transaction.atomic():
        request = Request.objects.get(pk=delivery.request_id)
        fields: dict = {"attempts": delivery.attempt, "last_error": (error or "")[:2000]}
        delay = None
        if error is None:
            fields.update(status=Callback.Status.DELIVERED, next_at=None)
            reason = f"callback delivered to {host} (attempt {delivery.attempt})"
        elif delivery.attempt >= knobs["WEBHOOK_ATTEMPTS"]:
            fields.update(status=Callback.Status.FAILED, next_at=None)
            reason = (
                f"callback to {host} failed: {error}; gave up after {delivery.attempt} attempts"
            )
        else:
            delay = backoff_s(delivery.attempt, 1.0, knobs["WEBHOOK_RETRY_MAX_S"])
            fields["next_at"] = timezone.now() + timedelta(seconds=delay)
            then = f"attempt {delivery.attempt + 1} in {delay:.0f} s"
            reason = f"callback to {host} failed: {error}; {then}"
        Callback.objects.filter(pk=delivery.request_id).update(**fields)
        Trace.objects.create(
            request=request, from_state=request.state, to_state=request.state, reason=reason
        )
    (log.info if error is None else log.warning)("request %s: %s", delivery.request_id, reason)
    return delay


class Webhooks:
    """The worker's side task: after passes and quiet ends (a request may have ended), and
    every poll interval, send what is due, each attempt in a task of its own."""

    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime
        self.sending: set[asyncio.Task] = set()

    async def run(self) -> None:
        knobs = settings.SWITCHYARD
        rt = self.runtime
        timeout = httpx.Timeout(knobs["WEBHOOK_TIMEOUT_S"])
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            try:
                while True:
                    # Counted before the look: a request that ends while it runs or during
                    # the gap calls for another (counted after, its end was missed until
                    # the next poll).
                    seen = (rt.passes, rt.quiet_ends)
                    started = time.monotonic()
                    await self.send_due(client)
                    await asyncio.sleep(max(MIN_GAP_S - (time.monotonic() - started), 0))
                    async with rt.passed:
                        try:
                            async with asyncio.timeout(knobs["POLL_INTERVAL_S"]):
                                await rt.passed.wait_for(
                                    lambda seen=seen: (rt.passes, rt.quiet_ends) != seen
                                )
                        except TimeoutError:
                            pass
            finally:
                for task in self.sending:
                    task.cancel()
                await asyncio.gather(*self.sending, return_exceptions=True)

    async def send_due(self, client: httpx.AsyncClient) -> None:
        """Claim the callbacks due now and send each in a task of its own."""
        try:
            deliveries = await in_pool_thread(claim_due)()
        except faults.DATABASE_FAULTS as error:  # the worker starts again
            log.info("looking for callbacks to send failed: %r", error)
            return
        except Exception:  # a failed look must not end the worker
            log.exception("looking for callbacks to send failed")
            return
        for delivery in deliveries:
            task = asyncio.create_task(self.send(client, delivery))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def send(self, client: httpx.AsyncClient, delivery: Delivery) -> None:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "Switchyard",
            "X-Switchyard-Request-Id": str(delivery.request_id),
            "X-Switchyard-Signature": signature(delivery.body, delivery.secret),
        }
        try:
            answer = await client.post(delivery.url, content=delivery.body, headers=headers)
            error = None if answer.is_success else f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        try:
            retry_in = await in_pool_thread(record)(delivery, error)
        except Exception:
            log.exception("recording the callback of %s failed", delivery.request_id)
            return
        if retry_in is not None:  # at its time, not at the next poll
            await asyncio.sleep(retry_in)
            await self.send_due(client)

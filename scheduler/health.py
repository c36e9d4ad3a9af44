"""Liveness and readiness of a web process, for a load balancer or a supervisor.

`/healthz` answers while the process serves, and touches nothing else. `/readyz` answers
200 only when what a request needs answers: the database, the channel layer (where Redis is
configured) and at least one worker whose heartbeat is fresh; else 503 with what failed.
Both skip the site's middleware (see config.asgi) and need no login: they tell nothing."""

import asyncio
import time

import redis.asyncio as redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from .models import Worker
from .pool_threads import in_pool_thread

PATHS = ("/healthz", "/readyz")
CHECK_TIMEOUT_S = 3.0  # a check that hangs (a database that stopped answering) fails


@require_GET
async def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@in_pool_thread
def database_and_workers() -> list[str]:
    """What failed of the database and the workers: read in one trip to a thread."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if Worker.objects.live().exists():
        return []
    stale_s = settings.SWITCHYARD["WORKER_STALE_S"]
    return [f"worker: no worker's heartbeat is fresher than {stale_s:g} s"]


async def channel_layer() -> list[str]:
    if not settings.REDIS_URL:
        return []  # the in-memory layer lives in this process
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        await client.ping()
    finally:
        await client.aclose()
    return []


async def checked(name: str, check) -> list[str]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            return await check()
    except TimeoutError:
        return [f"{name}: no answer within {CHECK_TIMEOUT_S:g} s"]
    except Exception as exc:  # what failed is the answer, not an error of this view
        return [f"{name}: {type(exc).__name__}: {str(exc).strip()[:200]}"]


@require_GET
async def readyz(request: HttpRequest) -> JsonResponse:
    started = time.monotonic()
    results = await asyncio.gather(
        checked("database", database_and_workers), checked("channel layer", channel_layer)
    )
    failures = [failure for result in results for failure in result]
    body = {
        "status": "unavailable" if failures else "ready",
        "failures": failures,
        "checked_in_s": round(time.monotonic() - started, 4),
    }
    return JsonResponse(body, status=503 if failures else 200)

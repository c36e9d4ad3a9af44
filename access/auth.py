"""Who is calling: the Bearer key of an API call, checked against a short per-process cache.

A verified key is kept for SWITCHYARD_AUTH_CACHE_S (2 s) so that the hot path pays a SHA-256
and a constant-time compare (a few microseconds), not a database read; a key revoked, edited
or expired in the admin is therefore refused on every process within that time. With
SWITCHYARD_AUTH=off every call is anonymous (None) and sees everything."""

import hmac
import threading
import time
from typing import NamedTuple

from django.conf import settings
from django.utils import timezone

from scheduler.api.errors import ApiError
from scheduler.pool_threads import in_pool_thread

from .models import ApiKey, hash_key, split_key

MAX_CACHED = 10_000  # distinct prefixes; beyond, the cache starts afresh


class Cached(NamedTuple):
    key: ApiKey | None  # None: no key has this prefix
    read_at: float


_cache: dict[str, Cached] = {}
_lock = threading.Lock()


def invalid_api_key() -> ApiError:
    """The one answer for a key missing, malformed, unknown, revoked or expired."""
    return ApiError(
        401,
        "Incorrect or missing API key: send `Authorization: Bearer <key>`. An operator"
        " creates keys (python manage.py create_api_key NAME).",
        code="invalid_api_key",
    )


def required() -> bool:
    return settings.SWITCHYARD_AUTH != "off"


def authorization(header: str | None, x_api_key: str | None) -> str | None:
    """The caller's key as an `Authorization` header: that header if sent, else the key as
    Anthropic's clients send it (`x-api-key`), for the inference paths and `/v1/models`."""
    if header is not None or x_api_key is None:
        return header
    return f"Bearer {x_api_key}"


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _fresh(prefix: str) -> Cached | None:
    found = _cache.get(prefix)
    if found is not None and time.monotonic() - found.read_at < settings.SWITCHYARD["AUTH_CACHE_S"]:
        return found
    return None


def _read(prefix: str) -> Cached:
    key = ApiKey.objects.select_related("team").filter(prefix=prefix).first()
    found = Cached(key, time.monotonic())
    with _lock:
        if len(_cache) >= MAX_CACHED:
            _cache.clear()
        _cache[prefix] = found
    return found


def _verified(found: Cached, key: str) -> ApiKey:
    api_key = found.key
    # Compared even for an unknown prefix, so that the answer takes the same time.
    stored = api_key.hashed_key if api_key is not None else "0" * 64
    if not hmac.compare_digest(hash_key(key), stored) or api_key is None:
        raise invalid_api_key()
    if not api_key.is_usable(timezone.now()):
        raise invalid_api_key()
    return api_key


def _parts(header: str | None) -> tuple[str, str]:
    parts = split_key(bearer(header) or "")
    if parts is None:
        raise invalid_api_key()
    return parts


def caller(header: str | None) -> ApiKey | None:
    """The key of an `Authorization` header (sync; may read the database). None when auth
    is off; ApiError 401 if the key is not good."""
    if not required():
        return None
    return verified(header)


def verified(header: str | None) -> ApiKey:
    """The key of an `Authorization` header whatever SWITCHYARD_AUTH says (an operator key
    works with auth off too); ApiError 401 if the key is not good."""
    prefix, key = _parts(header)
    return _verified(_fresh(prefix) or _read(prefix), key)


async def acaller(header: str | None) -> ApiKey | None:
    """`caller` for async code: a key in the cache costs no thread hop."""
    if not required():
        return None
    prefix, key = _parts(header)
    found = _fresh(prefix) or await in_pool_thread(_read)(prefix)
    return _verified(found, key)


def forget() -> None:
    """Empty this process's cache (tests)."""
    with _lock:
        _cache.clear()

"""The checks Django's middleware makes for the site, made for the API paths too (they skip
it, for speed; see config/asgi.py): the Host header must be one of ALLOWED_HOSTS, and a
browser's cross-site write is refused.

A cross-site page can make a browser POST `text/plain` with no preflight; JSON parsers here
would take the body all the same. Browsers say where a request comes from (`Origin`,
`Sec-Fetch-Site`); API clients (the OpenAI SDKs, curl) send neither, and pass."""

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from .errors import ApiError

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def allowed_hosts() -> list[str]:
    """As Django's `HttpRequest.get_host` allows them."""
    hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not hosts:
        return [".localhost", "127.0.0.1", "[::1]"]
    return hosts


def header(scope: dict[str, Any], name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def host_of(scope: dict[str, Any]) -> str:
    host = header(scope, b"host")
    if host is None and scope.get("server"):
        address, port = scope["server"]
        host = f"{address}:{port}" if port else str(address)
    return host or ""


def refusal(scope: dict[str, Any]) -> ApiError | None:
    """Why this HTTP request must be refused before any app sees it, or None."""
    host = host_of(scope)
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, allowed_hosts()):
        return ApiError(
            400,
            "The Host header is not one this server answers to (ALLOWED_HOSTS).",
            code="disallowed_host",
        )
    if scope["method"] in SAFE_METHODS:
        return None
    origin = header(scope, b"origin")
    if origin is not None and origin in settings.CSRF_TRUSTED_ORIGINS:
        return None
    if header(scope, b"sec-fetch-site") in ("cross-site", "same-site"):
        return cross_site()
    if origin is not None and not same_origin(origin, host):
        return cross_site()
    return None


def same_origin(origin: str, host: str) -> bool:
    """The Origin is this server itself."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def cross_site() -> ApiError:
    return ApiError(
        403,
        "A browser page of another site may not call this API (its Origin is not this server"
        " nor one of CSRF_TRUSTED_ORIGINS).",
        type="permission_error",
        code="cross_site_request",
    )

"""A job's `callback_url`, checked at submit: an http(s) URL to a host the operator allowed
(`SWITCHYARD_WEBHOOK_HOSTS`), so that Switchyard cannot be made to POST to an address inside
its network that nobody chose."""

from urllib.parse import urlsplit

from django.conf import settings

from .. import webhooks
from .errors import ApiError


def checked(url: object, api_key=None) -> str:
    """The URL, or a 400 saying why not. A job is signed with its key's webhook secret, or
    without a key (or a key made before keys had one) with SWITCHYARD_WEBHOOK_SECRET."""
    if not isinstance(url, str) or not url:
        raise refused("callback_url must be an http(s) URL", "invalid_type")
    if not settings.WEBHOOK_HOSTS or not webhooks.signing_secret(api_key):
        raise refused(
            "callbacks are off here: the operator allows none"
            " (SWITCHYARD_WEBHOOK_HOSTS, and a secret to sign them with)",
            "callbacks_disabled",
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise refused("callback_url is not a valid URL", "invalid_value") from None
    if len(url) > 2000 or parts.scheme not in ("http", "https") or not parts.hostname:
        raise refused(
            "callback_url must be an http(s) URL of at most 2000 characters", "invalid_value"
        )
    if parts.username or parts.password:
        raise refused("callback_url may not carry credentials", "invalid_value")
    if parts.hostname.lower() not in {h.lower() for h in settings.WEBHOOK_HOSTS}:
        raise refused(
            f"callbacks may go only to the hosts the operator allows; {parts.hostname!r} is"
            " not one (SWITCHYARD_WEBHOOK_HOSTS)",
            "callback_host_not_allowed",
        )
    return url


def refused(message: str, code: str) -> ApiError:
    return ApiError(400, message, param="callback_url", code=code)

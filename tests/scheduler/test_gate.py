"""The API paths skip the site's middleware, not its checks: a Host outside ALLOWED_HOSTS and a
browser's cross-site write are refused, in the OpenAI shape, before anything is stored."""

import json

import pytest

from config.asgi import http
from scheduler.models import Request
from tests.support import asgi

pytestmark = pytest.mark.django_db(transaction=True)
BODY = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def call(path: str, headers: dict[str, str], method: str = "POST") -> tuple[int, dict]:
    answered = await asgi.call(
        http, asgi.scope(method, path, headers, server=("127.0.0.1", 8000)), BODY
    )
    return answered.status, json.loads(answered.body)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/api/v1/jobs", "/healthz"])
async def test_a_host_outside_allowed_hosts_is_refused_on_every_api_path(path):
    status, body = await call(path, {"Host": "evil.example", "Content-Type": "application/json"})
    assert status == 400
    assert body["error"]["code"] == "disallowed_host"
    assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example", "Content-Type": "text/plain"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        {"Origin": "null", "Content-Type": "application/json"},
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/v1/jobs"])
async def test_a_cross_site_browser_post_is_refused_and_stores_nothing(path, headers):
    status, body = await call(path, {"Host": "127.0.0.1:8000", **headers})
    assert status == 403
    assert body["error"]["code"] == "cross_site_request"
    assert not await Request.objects.aexists()


async def test_the_server_s_own_pages_and_trusted_origins_may_post(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://tools.example"]
    for origin in ("http://127.0.0.1:8000", "https://tools.example"):
        status, body = await call(
            "/v1/chat/completions", {"Host": "127.0.0.1:8000", "Origin": origin}
        )
        # Past the gate: refused for what it asks (no such model), not for where it is from.
        assert body["error"]["code"] not in ("cross_site_request", "disallowed_host"), body
        assert status != 403


async def test_api_clients_that_send_no_origin_pass():
    status, body = await call("/v1/chat/completions", {"Host": "localhost:8000"})
    assert body["error"]["code"] not in ("cross_site_request", "disallowed_host"), body

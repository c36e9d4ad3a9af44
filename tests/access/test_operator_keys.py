"""The operator API with a key: a key with the operator flag may call it, any other key is
refused with 403, no key (nor staff login) with 401, all in the OpenAI error shape."""

import pytest

from scheduler.models import Intent
from tests import factories
from tests.access.conftest import bearer

OPERATOR_CALLS = [
    ("get", "/api/v1/servers", None),
    ("post", "/api/v1/servers/gpu-1/load", {"model": "b"}),
    ("post", "/api/v1/servers/gpu-1/unload", {"model": "a"}),
    ("post", "/api/v1/servers/gpu-1/drain", None),
    ("post", "/api/v1/servers/gpu-1/enable", None),
]


@pytest.fixture
def fleet(db):
    srv = factories.server("gpu-1")
    factories.deployment(srv, "a", state="loaded")
    factories.deployment(srv, "b")
    return srv


def call(client, method: str, path: str, body, headers: dict[str, str]):
    if method == "get":
        return client.get(path, headers=headers)
    return client.post(path, body or {}, content_type="application/json", headers=headers)


def error_of(response) -> tuple[int, str]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return response.status_code, error["code"]


@pytest.mark.auth
@pytest.mark.parametrize(("method", "path", "body"), OPERATOR_CALLS)
def test_an_operator_key_may_call_and_others_may_not(client, fleet, make_key, method, path, body):
    _, operator = make_key("ops", operator=True)
    _, app = make_key("app")
    assert error_of(call(client, method, path, body, {})) == (401, "unauthorized")
    bad = {"Authorization": "Bearer sy-00000000.nope"}
    assert error_of(call(client, method, path, body, bad)) == (401, "invalid_api_key")
    refused = call(client, method, path, body, bearer(app))
    assert error_of(refused) == (403, "permission_denied")
    assert Intent.objects.count() == 0
    # No session, so no CSRF token either: a key's call needs none.
    answer = call(client, method, path, body, bearer(operator))
    assert answer.status_code == (200 if method == "get" else 202), answer.content
    if method == "post":
        intent = Intent.objects.get()
        assert intent.requested_by == f"key ops (sy-{operator[3:11]}…)"
        reason = answer.json()["trace"][0]["reason"]
        assert reason == f"asked by {intent.requested_by} through the API"


@pytest.mark.auth
def test_a_revoked_or_expired_operator_key_is_refused(client, fleet, make_key):
    from datetime import timedelta

    from django.utils import timezone

    from access import auth

    api_key, secret = make_key("ops", operator=True)
    assert client.get("/api/v1/servers", headers=bearer(secret)).status_code == 200
    api_key.revoked = True
    api_key.save()
    auth.forget()  # what SWITCHYARD_AUTH_CACHE_S does within 2 s
    r = client.get("/api/v1/servers", headers=bearer(secret))
    assert error_of(r) == (401, "invalid_api_key")
    api_key.revoked, api_key.expires_at = False, timezone.now() - timedelta(seconds=1)
    api_key.save()
    auth.forget()
    assert error_of(client.get("/api/v1/servers", headers=bearer(secret)))[0] == 401


def test_with_auth_off_an_operator_key_still_counts_and_others_do_not(client, fleet, make_key):
    """SWITCHYARD_AUTH=off opens the inference and jobs API, not the operator API."""
    _, operator = make_key("ops", operator=True)
    _, app = make_key("app")
    assert error_of(client.get("/api/v1/servers")) == (401, "unauthorized")
    assert error_of(client.get("/api/v1/servers", headers=bearer(app))) == (
        403,
        "permission_denied",
    )
    assert client.get("/api/v1/servers", headers=bearer(operator)).status_code == 200


@pytest.mark.auth
def test_the_schema_names_both_ways_in(client, fleet, make_key):
    _, operator = make_key("ops", operator=True)
    schema = client.get("/api/schema/", {"format": "json"}, headers=bearer(operator)).json()
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    for path, item in schema["paths"].items():
        if path.startswith("/api/v1/servers"):
            for operation in item.values():
                assert operation["security"] == [{"apiKey": []}, {"staffSession": []}]


@pytest.mark.django_db(transaction=True)
def test_an_operator_key_through_a_live_process(served, make_key):
    """Through the API's own handler (no site middleware), with keys required."""
    import httpx

    from tests.scheduler.test_operator_api import until_done

    srv = factories.server("sim", slots=1)
    factories.deployment(srv, "a")
    _, operator = make_key("ops", operator=True)
    _, app = make_key("app")
    live = served(SWITCHYARD_AUTH="required")
    url = f"{live.url}/api/v1/servers/sim/load"
    refused = httpx.post(url, json={"model": "a"}, headers=bearer(app))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert httpx.post(url, json={"model": "a"}).json()["error"]["code"] == "unauthorized"
    asked = httpx.post(url, json={"model": "a"}, headers=bearer(operator))
    assert asked.status_code == 202, asked.text
    done = until_done(live, bearer(operator), asked.json()["id"])
    assert done.status == "done", done.outcome

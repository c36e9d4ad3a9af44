"""The operator API for keys and teams: a script makes a key (its secret shown once), sets
its limits and team, revokes it; the key it made works at once and stops when revoked; bad
input changes nothing and answers in the OpenAI error shape; only operators may call it."""

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from access import auth
from access.models import ApiKey, Team
from scheduler.models import State
from tests import factories
from tests.access.conftest import bearer

pytestmark = pytest.mark.auth


@pytest.fixture
def ops(make_key) -> dict[str, str]:
    _, secret = make_key("ops", operator=True)
    return bearer(secret)


def post(client, path: str, body: dict, headers: dict[str, str]):
    return client.post(path, body, content_type="application/json", headers=headers)


def patch(client, path: str, body: dict, headers: dict[str, str]):
    return client.patch(path, body, content_type="application/json", headers=headers)


def error_of(response) -> tuple[int, str | None, str | None]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return response.status_code, error["param"], error["code"]


def test_a_key_made_through_the_api_works_until_revoked(client, ops, caplog):
    caplog.set_level(logging.INFO, logger="scheduler.api.keys")
    made = post(
        client,
        "/api/v1/keys",
        {"name": "chat-app", "max_priority": "high", "rpm": 60, "allowed_models": ["m"]},
        ops,
    )
    assert made.status_code == 201, made.content
    body = made.json()
    secret, prefix = body["key"], body["prefix"]
    assert secret.startswith(f"sy-{prefix}.") and body["webhook_secret"]
    assert (body["name"], body["max_priority"], body["default_priority"]) == (
        "chat-app",
        "high",
        "normal",
    )
    assert (body["rpm"], body["allowed_models"], body["revoked"]) == (60, ["m"], False)
    stored = ApiKey.objects.get(prefix=prefix)
    assert stored.hashed_key != secret and secret not in str(
        ApiKey.objects.filter(prefix=prefix).values().get()
    )

    # Shown once: reading it back never shows the secret again.
    again = client.get(f"/api/v1/keys/{prefix}", headers=ops).json()
    assert "key" not in again and "webhook_secret" not in again
    assert client.get("/api/v1/requests", headers=bearer(secret)).status_code == 200

    revoked = patch(client, f"/api/v1/keys/{prefix}", {"revoked": True}, ops)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    auth.forget()  # what SWITCHYARD_AUTH_CACHE_S does within 2 s
    assert error_of(client.get("/api/v1/requests", headers=bearer(secret)))[::2] == (
        401,
        "invalid_api_key",
    )
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"API key chat-app (sy-{prefix}…) created by key ops (sy-")
    assert said[1].endswith(": revoked=True")


def test_a_keys_webhook_secret_is_rotated_and_shown_once(client, ops):
    made = post(client, "/api/v1/keys", {"name": "jobs-app"}, ops).json()
    path = f"/api/v1/keys/{made['prefix']}/rotate-webhook-secret"
    rotated = post(client, path, {}, ops)
    assert rotated.status_code == 200
    secret = rotated.json()["webhook_secret"]
    assert secret != made["webhook_secret"]
    assert ApiKey.objects.get(prefix=made["prefix"]).webhook_secret == secret  # signs from now
    assert secret not in client.get(f"/api/v1/keys/{made['prefix']}", headers=ops).content.decode()
    assert error_of(post(client, "/api/v1/keys/00000000/rotate-webhook-secret", {}, ops))[0] == 404


def test_a_key_joins_and_leaves_a_team_by_its_name(client, ops):
    team = post(client, "/api/v1/teams", {"name": "research", "weight": 3}, ops)
    assert team.status_code == 201, team.content
    assert team.json() | {"used_today": None} == {
        "name": "research",
        "weight": 3,
        "max_processing": None,
        "daily_processing_s": None,
        "daily_tokens": None,
        "keys": 0,
        "used_today": None,
    }
    prefix = post(client, "/api/v1/keys", {"name": "a", "team": "research"}, ops).json()["prefix"]
    assert ApiKey.objects.get(prefix=prefix).team.name == "research"
    assert client.get("/api/v1/teams/research", headers=ops).json()["keys"] == 1

    changed = patch(client, "/api/v1/teams/research", {"daily_tokens": 1000}, ops)
    assert changed.json()["daily_tokens"] == 1000 and changed.json()["weight"] == 3
    left = patch(client, f"/api/v1/keys/{prefix}", {"team": None}, ops)
    assert left.json()["team"] is None
    assert client.get("/api/v1/teams/research", headers=ops).json()["keys"] == 0


def test_lists_show_what_each_used_today(client, ops, make_key):
    research = Team.objects.create(name="research")
    alice, _ = make_key("alice", team=research)
    bob, _ = make_key("bob", team=research)
    now = timezone.now()
    for api_key, tokens in ((alice, 10), (bob, 5)):
        factories.request(
            "m",
            api_key=api_key,
            state=State.COMPLETED,
            started_at=now - timedelta(seconds=2),
            finished_at=now,
            result={"usage": {"prompt_tokens": tokens, "completion_tokens": 1}},
        )
    keys = client.get("/api/v1/keys", headers=ops).json()
    assert keys["object"] == "list" and keys["has_more"] is False
    used = {k["name"]: k["used_today"]["prompt_tokens"] for k in keys["data"]}
    assert used == {"alice": 10, "bob": 5, "ops": 0}
    teams = client.get("/api/v1/teams", headers=ops).json()["data"]
    assert [(t["name"], t["keys"]) for t in teams] == [("research", 2)]
    assert teams[0]["used_today"]["prompt_tokens"] == 15
    assert teams[0]["used_today"]["requests"] == 2


def test_the_key_list_filters_by_team(client, ops, make_key):
    research = Team.objects.create(name="research")
    make_key("alice", team=research)
    make_key("bob")

    def names(query: str) -> list[str]:
        return [k["name"] for k in client.get(f"/api/v1/keys?{query}", headers=ops).json()["data"]]

    assert names("team=research") == ["alice"]
    assert names("team=") == ["bob", "ops"]  # in no team
    assert error_of(client.get("/api/v1/keys?team=ghost", headers=ops))[::2] == (
        404,
        "team_not_found",
    )


def test_lists_page_by_name(client, ops, make_key):
    for name in ("b", "c", "a"):
        make_key(name)
    first = client.get("/api/v1/keys?limit=2", headers=ops).json()
    assert [k["name"] for k in first["data"]] == ["a", "b"] and first["has_more"]
    rest = client.get(f"/api/v1/keys?limit=2&cursor={first['next_cursor']}", headers=ops)
    assert [k["name"] for k in rest.json()["data"]] == ["c", "ops"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/api/v1/keys", {}, "name"),
        ("/api/v1/keys", {"name": "x", "max_priority": "urgent"}, "max_priority"),
        ("/api/v1/keys", {"name": "x", "team": "ghost"}, "team"),
        ("/api/v1/keys", {"name": "x", "weight": 0}, "weight"),
        ("/api/v1/keys", {"name": "x", "rpm": -1}, "rpm"),
        ("/api/v1/keys", {"name": "x", "allowed_models": "m"}, "allowed_models"),
        ("/api/v1/keys", {"name": "x", "stream_progress": "loud"}, "stream_progress"),
        ("/api/v1/teams", {"name": "t", "weight": 0}, "weight"),
        ("/api/v1/teams", {"weight": 2}, "name"),
        # A misspelt limit is refused, not dropped: the key would be made without it.
        ("/api/v1/keys", {"name": "x", "rate_per_minute": 5}, "rate_per_minute"),
        ("/api/v1/teams", {"name": "t", "wieght": 2}, "wieght"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(client, ops, path, body, param):
    keys, teams = ApiKey.objects.count(), Team.objects.count()
    status, named, _ = error_of(post(client, path, body, ops))
    assert (status, named) == (400, param)
    assert (ApiKey.objects.count(), Team.objects.count()) == (keys, teams)


def test_unknown_keys_and_teams_are_404(client, ops):
    assert error_of(client.get("/api/v1/keys/00000000", headers=ops)) == (
        404,
        "prefix",
        "key_not_found",
    )
    missing = patch(client, "/api/v1/teams/ghost", {"weight": 2}, ops)
    assert error_of(missing) == (404, "name", "team_not_found")
    # A NUL in the path, which PostgreSQL would refuse to compare, names nothing either.
    assert error_of(client.get("/api/v1/teams/a%00b", headers=ops))[0] == 404
    assert error_of(client.get("/api/v1/keys/a%00b", headers=ops))[0] == 404


def test_a_team_name_is_taken_once(client, ops):
    Team.objects.create(name="research")
    assert error_of(post(client, "/api/v1/teams", {"name": "research"}, ops))[:2] == (400, "name")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/keys"),
        ("post", "/api/v1/keys"),
        ("get", "/api/v1/teams"),
        ("post", "/api/v1/teams"),
        ("patch", "/api/v1/teams/research"),
        ("post", "/api/v1/keys/00000000/rotate-webhook-secret"),
    ],
)
def test_only_operators_may_call_it(client, make_key, method, path):
    Team.objects.create(name="research")
    _, app = make_key("app")
    body = {"name": "sneaky"}
    for headers, expected in (({}, (401, "unauthorized")), (bearer(app), (403, "perm"))):
        if method == "get":
            answer = client.get(path, headers=headers)
        else:
            call = getattr(client, method)
            answer = call(path, body, content_type="application/json", headers=headers)
        status, _, code = error_of(answer)
        assert (status, code[:4]) == (expected[0], expected[1][:4])
    assert not ApiKey.objects.filter(name="sneaky").exists()
    assert not Team.objects.filter(name="sneaky").exists()


def test_what_a_get_answered_may_be_sent_back(client, ops):
    made = post(client, "/api/v1/keys", {"name": "x"}, ops).json()
    listed = client.get(f"/api/v1/keys/{made['prefix']}", headers=ops).json()
    changed = patch(client, f"/api/v1/keys/{made['prefix']}", {**listed, "rpm": 30}, ops)
    assert changed.status_code == 200 and changed.json()["rpm"] == 30

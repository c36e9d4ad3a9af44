"""`GET /api/v1/key`: a key's own limits, its team's, what each used today and what is left,
and where it stands now; nothing secret; any key may ask about itself only."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from access.models import Team
from scheduler.models import Priority, State
from tests import factories
from tests.access.conftest import bearer

pytestmark = pytest.mark.auth


def finished(api_key, prompt: int, completion: int, took_s: float) -> None:
    now = timezone.now()
    factories.request(
        "m",
        api_key=api_key,
        state=State.COMPLETED,
        started_at=now - timedelta(seconds=took_s),
        finished_at=now,
        result={"usage": {"prompt_tokens": prompt, "completion_tokens": completion}},
    )


def test_a_key_sees_its_limits_its_teams_what_they_used_and_what_is_left(client, make_key):
    research = Team.objects.create(name="research", daily_tokens=1000, max_processing=3)
    alice, secret = make_key(
        "alice",
        team=research,
        rpm=60,
        max_waiting=5,
        daily_tokens=100,
        max_priority=Priority.HIGH,
        allowed_models=["m"],
    )
    bob, _ = make_key("bob", team=research)
    finished(alice, 70, 10, 2.1234567)
    finished(bob, 500, 100, 4.0)
    factories.request("m", api_key=alice)  # waiting now, sent in the last minute

    answer = client.get("/api/v1/key", headers=bearer(secret))

    assert answer.status_code == 200
    body = answer.json()
    assert (body["prefix"], body["name"]) == (alice.prefix, "alice")
    assert (body["max_priority"], body["default_priority"]) == ("high", "normal")
    assert (body["rpm"], body["max_waiting"], body["allowed_models"]) == (60, 5, ["m"])
    assert body["used_today"]["prompt_tokens"] == 70
    assert body["used_today"]["processing_s"] == 2.123  # to the ms, as the usage report
    assert body["left_today"] == {"processing_s": None, "tokens": 20}
    assert body["now"] == {"waiting": 1, "last_minute": 2}
    team = body["team"]
    assert (team["name"], team["max_processing"], team["daily_tokens"]) == ("research", 3, 1000)
    assert team["used_today"]["requests"] == 2
    assert team["left_today"] == {"processing_s": None, "tokens": 320}
    text = json.dumps(body)
    assert secret not in text and alice.webhook_secret not in text and "hash" not in text


def test_a_quota_used_up_leaves_nothing_never_less(client, make_key):
    api_key, secret = make_key("heavy", daily_tokens=10, daily_processing_s=1)
    finished(api_key, 50, 5, 3.0)
    body = client.get("/api/v1/key", headers=bearer(secret)).json()
    assert body["left_today"] == {"processing_s": 0.0, "tokens": 0}
    assert body["team"] is None


def test_no_key_or_a_bad_one_is_401_and_with_keys_off_none_is_yours(client, make_key, settings):
    assert client.get("/api/v1/key").status_code == 401
    bad = client.get("/api/v1/key", headers=bearer("sy-nothing.wrong"))
    assert (bad.status_code, bad.json()["error"]["code"]) == (401, "invalid_api_key")
    settings.SWITCHYARD_AUTH = "off"
    off = client.get("/api/v1/key")
    assert (off.status_code, off.json()["error"]["code"]) == (404, "no_api_key")
    # A key still says what it is, keys off or not.
    _, secret = make_key("app")
    assert client.get("/api/v1/key", headers=bearer(secret)).json()["name"] == "app"

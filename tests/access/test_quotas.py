"""Daily quotas of an API key, in GPU terms: processing seconds and tokens a UTC day,
checked at the door from what its ended requests used."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from access import limits
from access.models import ApiKey, Team
from scheduler.api.errors import ApiError
from scheduler.models import Request
from tests import factories

from .test_usage import finished

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def refusal(api_key, now: datetime | None = None) -> ApiError | None:
    try:
        limits.check_daily_quota(api_key, now or timezone.now())
    except ApiError as error:
        return error
    return None


def test_a_key_under_its_daily_seconds_is_let_in_and_one_that_used_them_is_not(make_key):
    api_key, _ = make_key("batch", daily_processing_s=60)
    finished(api_key, timedelta(0), 10, 2, 59.0)
    assert refusal(api_key) is None
    finished(api_key, timedelta(0), 10, 2, 1.5)
    error = refusal(api_key)
    assert (error.status, error.code, error.type) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )
    assert "60 s of processing, its quota of 60 s a day" in error.message
    assert error.headers()["x-should-retry"] == "false"


def test_the_quota_renews_at_midnight_utc(make_key):
    """What ended yesterday does not count today; Retry-After is the time to midnight."""
    api_key, _ = make_key("batch", daily_tokens=100)
    now = datetime(2026, 11, 29, 23, 0, tzinfo=UTC)
    r = finished(api_key, timedelta(0), 90, 20, 1.0)
    Request.objects.filter(pk=r.pk).update(finished_at=now - timedelta(minutes=5))
    error = refusal(api_key, now)
    assert error.retry_after_s == 3600 and "renews at 00:00 UTC, in 1 h 0 min" in error.message
    assert "110 tokens, its quota of 100 a day" in error.message
    assert refusal(api_key, now + timedelta(hours=1, seconds=1)) is None


def test_other_keys_use_does_not_count(make_key):
    mine, _ = make_key("mine", daily_tokens=10)
    other, _ = make_key("other")
    finished(other, timedelta(0), 500, 500, 100.0)
    factories.request("m", api_key=mine)  # waiting: counts only once it ends
    assert refusal(mine) is None


def test_a_team_quota_counts_all_its_keys_and_refuses_each(make_key):
    """A team of two keys with 60 s a day: 40 s by one and 25 s by the other refuse both at
    the door, naming the team; a key in no team, and a key of another team, are let in."""
    research = Team.objects.create(name="research", daily_processing_s=60)
    other_team = Team.objects.create(name="ops", daily_processing_s=60)
    alice, _ = make_key("alice", team=research)
    bob, _ = make_key("bob", team=research)
    carol, _ = make_key("carol")
    dave, _ = make_key("dave", team=other_team)
    finished(alice, timedelta(0), 1, 1, 40.0)
    assert admitted(bob) is None
    finished(bob, timedelta(0), 1, 1, 25.0)
    for key in (alice, bob):
        error = admitted(key)
        assert (error.status, error.code) == (429, "insufficient_quota")
        assert error.message.startswith("The team research has used 65 s of processing, its")
    assert admitted(carol) is None and admitted(dave) is None


def test_a_key_quota_and_its_teams_both_hold(make_key):
    """The key's own quota refuses it though its team has room."""
    team = Team.objects.create(name="research", daily_tokens=1000)
    alice, _ = make_key("alice", team=team, daily_tokens=10)
    finished(alice, timedelta(0), 8, 4, 1.0)
    assert admitted(alice).message.startswith("This API key has used 12 tokens")


def test_the_tokens_left_are_told_in_openais_headers_by_the_tightest_quota(make_key):
    """The key has 100 tokens a day and its team 30 left of 1000: the headers tell the
    team's, renewing at midnight; once none are left the 429 says 0 too."""
    team = Team.objects.create(name="research", daily_tokens=1000)
    alice, _ = make_key("alice", team=team, daily_tokens=100)
    bob, _ = make_key("bob", team=team)
    finished(alice, timedelta(0), 10, 2, 1.0)
    finished(bob, timedelta(0), 900, 58, 1.0)
    fresh = ApiKey.objects.select_related("team").get(pk=alice.pk)
    headers = limits.admit(fresh)
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "30"
    assert headers["x-ratelimit-reset-tokens"].endswith("s")
    finished(bob, timedelta(0), 30, 0, 1.0)
    refused = admitted(alice).headers()
    assert refused["x-ratelimit-remaining-tokens"] == "0"
    assert refused["x-ratelimit-limit-tokens"] == "1000"


def test_a_key_with_no_rpm_nor_token_quota_gets_no_ratelimit_headers(make_key):
    api_key, _ = make_key("plain", daily_processing_s=60, max_waiting=5)
    assert limits.admit(api_key) == {}
    assert limits.admit(None) == {}


@pytest.mark.parametrize(
    "seconds, written",
    [(0.25, "250ms"), (1, "1s"), (44.2, "45s"), (60, "1m0s"), (360, "6m0s"), (47125, "13h5m25s")],
)
def test_reset_times_are_written_as_openai_writes_them(seconds, written):
    assert limits.duration(seconds) == written


def admitted(api_key) -> ApiError | None:
    """What the door says to the key's next request (its row read again, as auth does)."""
    try:
        limits.admit(ApiKey.objects.select_related("team").get(pk=api_key.pk))
    except ApiError as error:
        return error
    return None

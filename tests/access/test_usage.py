"""Usage per key per day: counted from the requests, kept when retention purges them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from access import usage
from access.models import KeyUsage, Team
from scheduler import retention
from scheduler.models import Request
from tests import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def finished(api_key, ago: timedelta, prompt: int, completion: int, took_s: float) -> Request:
    ended = timezone.now() - ago
    r = factories.request("m", api_key=api_key)
    Request.objects.filter(pk=r.pk).update(
        state="completed",
        started_at=ended - timedelta(seconds=took_s),
        finished_at=ended,
        result={"usage": {"prompt_tokens": prompt, "completion_tokens": completion}},
    )
    return r


def test_usage_is_summed_by_key_and_day(make_key):
    alice, _ = make_key("alice")
    bob, _ = make_key("bob")
    finished(alice, timedelta(0), 10, 2, 1.5)
    finished(alice, timedelta(0), 5, 1, 0.5)
    finished(bob, timedelta(0), 7, 7, 2.0)
    failed = factories.request("m", api_key=alice)
    Request.objects.filter(pk=failed.pk).update(state="failed", finished_at=timezone.now())
    factories.request("m", api_key=alice)  # still waiting: not counted yet
    today = timezone.now().date()
    found = usage.usage()
    assert found[alice.pk, today] == {
        "requests": 3,
        "prompt_tokens": 15,
        "completion_tokens": 3,
        "processing_s": pytest.approx(2.0),
    }
    assert found[bob.pk, today]["prompt_tokens"] == 7


def test_usage_outlives_the_requests_retention_purges(make_key):
    alice, _ = make_key("alice")
    old_day = (timezone.now() - timedelta(days=40)).date()
    finished(alice, timedelta(days=40), 10, 4, 3.0)
    before = usage.usage(alice.pk)
    assert retention.purge_finished(timezone.now() - timedelta(days=30)) == 1
    assert not Request.objects.exists()
    assert KeyUsage.objects.get().requests == 1
    assert usage.usage(alice.pk) == before
    assert usage.usage(alice.pk)[alice.pk, old_day]["completion_tokens"] == 4


def test_todays_usage_is_in_metrics(make_key, admin_client):
    alice, _ = make_key("alice")
    finished(alice, timedelta(0), 11, 3, 1.0)
    text = admin_client.get("/metrics").content.decode()
    assert f'switchyard_key_prompt_tokens_today{{key="alice",key_id="{alice.pk}"}} 11.0' in text
    assert f'switchyard_key_requests_today{{key="alice",key_id="{alice.pk}"}} 1.0' in text


def test_the_share_of_each_daily_quota_used_is_in_metrics(make_key, admin_client):
    """For alerts before a key runs out; a key without a quota has none, one that has
    not sent anything today shows 0."""
    alice, _ = make_key("alice", daily_processing_s=10, daily_tokens=100)
    idle, _ = make_key("idle", daily_tokens=100)
    make_key("free")
    finished(alice, timedelta(0), 20, 5, 4.0)
    text = admin_client.get("/metrics").content.decode()
    ratio = "switchyard_key_quota_used_ratio"
    assert f'{ratio}{{key="alice",key_id="{alice.pk}",quota="processing_seconds"}} 0.4' in text
    assert f'{ratio}{{key="alice",key_id="{alice.pk}",quota="tokens"}} 0.25' in text
    assert f'{ratio}{{key="idle",key_id="{idle.pk}",quota="tokens"}} 0.0' in text
    assert 'key="free"' not in text.split(ratio, 1)[1]


def test_the_share_of_a_teams_daily_quota_its_keys_used_is_in_metrics(make_key, admin_client):
    team = Team.objects.create(name="research", daily_tokens=100)
    Team.objects.create(name="unused")
    alice, _ = make_key("alice", team=team)
    bob, _ = make_key("bob", team=team)
    carol, _ = make_key("carol")
    finished(alice, timedelta(0), 20, 5, 1.0)
    finished(bob, timedelta(0), 10, 5, 1.0)
    finished(carol, timedelta(0), 500, 500, 1.0)  # in no team: not counted
    text = admin_client.get("/metrics").content.decode()
    ratio = "switchyard_team_quota_used_ratio"
    assert f'{ratio}{{quota="tokens",team="research",team_id="{team.pk}"}} 0.4' in text
    assert 'team="unused"' not in text  # no quota, no share

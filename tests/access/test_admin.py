"""The admin: keys made (shown once), revoked, their usage; server keys never shown back."""

import logging

import pytest
from django.db.models import ProtectedError
from django.forms.models import model_to_dict
from django.urls import reverse
from django.utils import timezone

from access.models import ApiKey, Team
from backends.models import Server
from backends.secret_field import ServerForm
from scheduler.models import Request
from tests import factories
from tests.support.admin_pages import act

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]
SERVER_SECRET = "sk-server-secret-0123456789-wxyz"


def test_adding_a_key_shows_it_once_and_keeps_its_hash(admin_client):
    response = admin_client.post(
        reverse("admin:access_apikey_add"),
        {
            "name": "team-a",
            "max_priority": 1,
            "default_priority": 2,
            "allowed_models": "[]",
            "weight": 2,
        },
        follow=True,
    )
    assert response.status_code == 200
    shown = "\n".join(str(m) for m in response.context["messages"])
    secret = next(w for w in shown.split() if w.startswith("sy-"))
    api_key = ApiKey.objects.get()
    assert api_key.hashed_key != secret and api_key.prefix in secret
    page = admin_client.get(reverse("admin:access_apikey_change", args=[api_key.pk]))
    assert secret not in page.content.decode()
    # Its webhook secret: shown once beside it, then only its last 4 characters.
    webhook = next(w for w in shown.split() if w.startswith("whsec-"))
    assert webhook == api_key.webhook_secret
    page = page.content.decode()
    assert webhook not in page and f"…{webhook[-4:]}" in page


def test_rotating_a_webhook_secret_shows_the_new_one_once(admin_client, make_key):
    api_key, _ = make_key("team-a")
    old = api_key.webhook_secret
    changelist = reverse("admin:access_apikey_changelist")
    shown = act(admin_client, changelist, "rotate_webhook_secret", [api_key.pk])
    new = ApiKey.objects.get().webhook_secret
    assert new != old and new.startswith("whsec-")
    assert new in shown and old not in shown
    page = admin_client.get(reverse("admin:access_apikey_change", args=[api_key.pk]))
    assert new not in page.content.decode() and old not in page.content.decode()


def test_revoke_and_restore_actions(admin_client, make_key):
    api_key, _ = make_key("team-a")
    changelist = reverse("admin:access_apikey_changelist")
    assert "Revoked 1" in act(admin_client, changelist, "revoke", [api_key.pk])
    assert ApiKey.objects.get().revoked
    assert "Restored 1" in act(admin_client, changelist, "restore", [api_key.pk])
    assert not ApiKey.objects.get().revoked


def test_a_keys_page_shows_its_usage_by_day(admin_client, make_key):
    api_key, _ = make_key("team-a", daily_tokens=1000)
    now = timezone.now()
    for tokens in (10, 5):
        r = factories.request("m", api_key=api_key)
        Request.objects.filter(pk=r.pk).update(
            state="completed",
            started_at=now - timezone.timedelta(seconds=2),
            finished_at=now,
            result={"usage": {"prompt_tokens": tokens, "completion_tokens": 3}},
        )
    page = admin_client.get(reverse("admin:access_apikey_change", args=[api_key.pk]))
    text = page.content.decode()
    assert "<td>2</td><td>15</td><td>6</td><td>4.0</td>" in text
    assert "4 s of processing; 21 tokens of 1000 (requests that ended" in text


def test_a_teams_page_lists_its_keys_and_what_they_all_used_today(
    admin_client, make_key, django_assert_max_num_queries
):
    team = Team.objects.create(name="research", weight=3, daily_processing_s=600)
    alice, _ = make_key("alice", team=team)
    bob, _ = make_key("bob", team=team)
    carol, _ = make_key("carol")
    now = timezone.now()
    for key, seconds in ((alice, 7), (bob, 3), (carol, 50)):
        r = factories.request("m", api_key=key)
        Request.objects.filter(pk=r.pk).update(
            state="completed", started_at=now - timezone.timedelta(seconds=seconds), finished_at=now
        )
    page = admin_client.get(reverse("admin:access_team_change", args=[team.pk])).content.decode()
    assert "alice" in page and "bob" in page and "carol" not in page
    assert "10 s of processing of 600; 0 tokens (requests that ended" in page
    assert f"<td>{now.date()}</td><td>2</td><td>0</td><td>0</td><td>10.0</td>" in page
    requests = admin_client.get(
        reverse("admin:scheduler_request_changelist") + f"?api_key__team__id__exact={team.pk}"
    ).content.decode()
    assert requests.count("field-short_id") == 2  # alice's and bob's, not carol's
    assert "sy-" in page and alice.hashed_key not in page  # prefixes, never secrets
    with django_assert_max_num_queries(8):  # one count of keys a team, not one query each
        listing = admin_client.get(reverse("admin:access_team_changelist"))
    assert listing.status_code == 200
    listed = listing.content.decode()
    assert '<td class="field-key_count">2</td>' in listed
    assert '<td class="field-limits">600 s a day</td>' in listed
    assert '<td class="field-used_today_listed">2 requests · 0 tokens · 10 s</td>' in listed
    with django_assert_max_num_queries(9):  # today's use read once for the page, not per key
        keys = admin_client.get(
            reverse("admin:access_apikey_changelist") + f"?team__id__exact={team.pk}"
        )
    shown = keys.content.decode()
    assert "alice" in shown and "bob" in shown and "carol" not in shown
    assert '<td class="field-used_today_listed">1 request · 0 tokens · 3 s</td>' in shown


def test_a_team_with_keys_cannot_be_deleted_from_under_them(make_key):
    """Deleting it would quietly lift its keys' quotas: they are moved out first."""
    team = Team.objects.create(name="research", max_processing=2)
    make_key("alice", team=team)
    with pytest.raises(ProtectedError):
        team.delete()


def test_a_servers_api_key_is_never_shown_back(admin_client, caplog):
    caplog.set_level(logging.DEBUG)
    server = factories.server("gpu", kind="openai", base_url="http://127.0.0.1:9")
    Server.objects.filter(pk=server.pk).update(api_key=SERVER_SECRET)
    server.refresh_from_db()
    page = admin_client.get(reverse("admin:backends_server_change", args=[server.pk]))
    text = page.content.decode()
    assert SERVER_SECRET not in text and "••••wxyz" in text
    data = {k: v for k, v in model_to_dict(server).items() if v is not None}
    data["api_key"] = ""  # left empty: kept
    form = ServerForm(data=data, instance=server)
    assert form.is_valid(), form.errors
    assert form.save().api_key == SERVER_SECRET
    form = ServerForm(data={**data, "api_key": "sk-new-1234"}, instance=server)
    assert form.is_valid() and form.save().api_key == "sk-new-1234"
    form = ServerForm(data={**data, "clear_api_key": "on"}, instance=server)
    assert form.is_valid() and form.save().api_key == ""
    assert SERVER_SECRET not in caplog.text

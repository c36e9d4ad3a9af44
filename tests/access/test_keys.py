"""Checking a key: what is refused, the one answer it gets, and what the cache spares."""

import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from access import auth
from access.models import ApiKey, Team, hash_key
from scheduler.api.errors import ApiError
from tests.support.manage_process import ROOT

pytestmark = pytest.mark.auth


def refused(header: str | None) -> dict:
    with pytest.raises(ApiError) as err:
        auth.caller(header)
    assert err.value.status == 401
    return err.value.body()


def test_a_key_is_random_shown_once_and_stored_hashed(make_key):
    api_key, secret = make_key("alice")
    other, other_secret = make_key("bob")
    assert secret != other_secret and len(secret) > 40
    assert secret.startswith(f"sy-{api_key.prefix}.")
    stored = ApiKey.objects.get(pk=api_key.pk)
    assert stored.hashed_key == hash_key(secret) and secret not in str(stored.__dict__)
    assert auth.caller(f"Bearer {secret}").pk == api_key.pk
    assert auth.caller(f"bearer  {other_secret} ").pk == other.pk


def test_every_bad_key_gets_the_same_401(make_key):
    api_key, secret = make_key("alice")
    revoked, revoked_secret = make_key("gone", revoked=True)
    expired, expired_secret = make_key("old", expires_at=timezone.now() - timedelta(seconds=1))
    wrong = secret[:-4] + ("aaaa" if not secret.endswith("aaaa") else "bbbb")
    unknown = "sy-00000000." + secret.split(".", 1)[1]
    answers = [
        refused(h)
        for h in [
            None,
            "",
            "Basic abc",
            f"Bearer {secret[3:]}",
            f"Bearer {wrong}",
            f"Bearer {unknown}",
            f"Bearer {revoked_secret}",
            f"Bearer {expired_secret}",
        ]
    ]
    assert all(a == answers[0] for a in answers)
    assert answers[0]["error"]["code"] == "invalid_api_key"


def test_a_revoked_key_is_refused_once_the_cache_has_aged(make_key, knobs):
    api_key, secret = make_key("alice")
    knobs(AUTH_CACHE_S=3600.0)
    assert auth.caller(f"Bearer {secret}")  # cached
    ApiKey.objects.filter(pk=api_key.pk).update(revoked=True)
    assert auth.caller(f"Bearer {secret}")  # trusted for AUTH_CACHE_S
    knobs(AUTH_CACHE_S=0.0)
    refused(f"Bearer {secret}")


def test_auth_off_lets_everyone_in_as_no_one(make_key, settings):
    settings.SWITCHYARD_AUTH = "off"
    assert auth.caller(None) is None


def test_a_cached_check_asks_the_database_nothing(make_key, django_assert_num_queries):
    """What a check costs is the bench's to measure (docs/performance.md); what keeps it
    cheap is that a key seen within the cache's lifetime is not read again."""
    _, secret = make_key("alice")
    header = f"Bearer {secret}"
    auth.caller(header)
    with django_assert_num_queries(0):
        for _ in range(3):
            assert auth.caller(header).name == "alice"


def test_create_api_key_prints_the_key_alone_on_its_last_line(db, capsys):
    call_command(
        "create_api_key",
        "batch-jobs",
        "--max-priority=high",
        "--default-priority=background",
        "--models=qwen,llama",
        "--rpm=60",
        "--max-waiting=10",
        "--max-processing=2",
        "--weight=3",
        "--daily-seconds=3600",
        "--daily-tokens=100000",
    )
    *said, secret = capsys.readouterr().out.strip().splitlines()
    api_key = auth.caller(f"Bearer {secret}")
    assert api_key.webhook_secret.startswith("whsec-")
    assert api_key.webhook_secret in said[0]  # shown once, before the key
    assert (api_key.name, api_key.max_priority, api_key.default_priority) == ("batch-jobs", 1, 3)
    assert api_key.allowed_models == ["qwen", "llama"]
    assert (api_key.rpm, api_key.max_waiting, api_key.max_processing, api_key.weight) == (
        60,
        10,
        2,
        3,
    )
    assert (api_key.daily_processing_s, api_key.daily_tokens) == (3600, 100_000)
    assert not api_key.operator and api_key.team is None


def test_create_api_key_joins_a_team_making_it_if_needed(db, capsys):
    call_command("create_api_key", "alice", "--team", "research")
    assert "Created team research" in capsys.readouterr().out
    call_command("create_api_key", "bob", "--team", "research")
    assert "Created team" not in capsys.readouterr().out
    team = Team.objects.get()
    assert sorted(team.keys.values_list("name", flat=True)) == ["alice", "bob"]
    with pytest.raises(CommandError, match="--team needs a name"):
        call_command("create_api_key", "carol", "--team", " ")


def test_bootstrap_prints_a_demo_key_beside_the_admin_password(
    transactional_db, capsys, fast_passwords
):
    call_command("bootstrap")
    out = capsys.readouterr().out
    assert "admin user" in out and "demo API key" in out
    secret = next(w for w in out.split() if w.startswith("sy-"))
    assert auth.caller(f"Bearer {secret}").name == "demo"
    call_command("bootstrap")
    assert "demo API key" not in capsys.readouterr().out
    assert ApiKey.objects.count() == 1


@pytest.mark.parametrize("mode, warned", [("off", True), ("required", False)])
def test_auth_off_is_warned_of_at_start(mode, warned):
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, "SWITCHYARD_AUTH": mode},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert ("SWITCHYARD_AUTH=off" in done.stderr) == warned


@pytest.mark.parametrize(
    "name, value, said",
    [
        ("SWITCHYARD_AUTH", "maybe", "SWITCHYARD_AUTH must be required or off"),
        ("SWITCHYARD_STREAM_PROGRESS", "thinking", "must be comments or reasoning"),
    ],
)
def test_an_unknown_mode_refuses_to_start(name, value, said):
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, name: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and said in done.stderr


def test_keys_are_listed_revoked_and_restored_from_the_command_line(db, capsys):
    """An operator on the host lists the keys (never a secret), revokes one by the prefix
    the list shows or by the whole key, and takes it back; a key made to expire says when."""
    call_command("create_api_key", "batch", "--rpm=60", "--daily-tokens=1000", "--team=lab")
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    call_command("create_api_key", "ops", "--operator", "--expires-in=30")
    capsys.readouterr()
    batch, ops = ApiKey.objects.get(name="batch"), ApiKey.objects.get(name="ops")
    assert abs(ops.expires_at - timezone.now() - timedelta(days=30)) < timedelta(minutes=1)

    call_command("list_api_keys")
    header, *rows = [re.split(r"\s{2,}", row) for row in capsys.readouterr().out.splitlines()]
    assert header == ["KEY", "NAME", "TEAM", "STATE", "OPERATOR", "MAX CLASS", "LIMITS", "CREATED"]
    listed = {row[1]: row for row in rows}
    assert listed["batch"][:7] == [
        f"sy-{batch.prefix}",
        "batch",
        "lab",
        "active",
        "no",
        "interactive",
        "rpm=60 daily-tokens=1000",
    ]
    assert listed["ops"][3].startswith("expires 2") and listed["ops"][4] == "yes"
    assert secret.split(".")[1] not in str(rows)

    call_command("revoke_api_key", f"sy-{batch.prefix}")
    assert "Revoked batch" in capsys.readouterr().out
    with pytest.raises(ApiError):
        auth.caller(f"Bearer {secret}")
    call_command("list_api_keys", "--usable")
    assert [row.split()[1] for row in capsys.readouterr().out.strip().splitlines()[1:]] == ["ops"]
    call_command("revoke_api_key", secret)  # the whole key names it too
    assert "already revoked" in capsys.readouterr().out
    call_command("revoke_api_key", batch.prefix, "--restore")
    assert "Restored batch" in capsys.readouterr().out
    assert not ApiKey.objects.get(pk=batch.pk).revoked
    with pytest.raises(CommandError, match="No API key"):
        call_command("revoke_api_key", "sy-00000000")

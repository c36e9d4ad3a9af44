"""The usage report (`GET /api/v1/usage`, `manage.py usage_report`): what keys and teams used
over a range of UTC days, grouped by key, team and/or day, as JSON, a table or CSV; the
purged days (KeyUsage) count as the kept requests do; bad input is a clear error; operators
only."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from access.models import KeyUsage, Team
from tests.access.conftest import bearer
from tests.access.test_keys_api import error_of
from tests.access.test_usage import finished

pytestmark = [pytest.mark.auth, pytest.mark.usefixtures("fast_passwords")]


@pytest.fixture
def ops(make_key) -> dict[str, str]:
    _, secret = make_key("ops", operator=True)
    return bearer(secret)


@pytest.fixture
def used(make_key):
    """Research's keys a and b, and c in no team: today, yesterday, a purged day 10 days ago
    (its KeyUsage row) and a request 40 days ago, outside the default 30 days."""
    research = Team.objects.create(name="research")
    a, _ = make_key("a", team=research)
    b, _ = make_key("b", team=research)
    c, _ = make_key("c")
    finished(a, timedelta(0), 10, 2, 1.5)
    finished(a, timedelta(days=1), 5, 1, 0.5)
    finished(b, timedelta(0), 7, 7, 2.0)
    finished(c, timedelta(0), 1, 1, 1.0)
    finished(c, timedelta(days=40), 100, 100, 100.0)
    today = timezone.now().date()
    KeyUsage.objects.create(
        api_key=b,
        day=today - timedelta(days=10),
        requests=4,
        prompt_tokens=40,
        completion_tokens=4,
        processing_s=8.0,
    )
    return {"a": a, "b": b, "c": c, "today": today}


def report(client, ops, query: str = "") -> dict:
    answer = client.get(f"/api/v1/usage{query}", headers=ops)
    assert answer.status_code == 200, answer.content
    return answer.json()


def figures(rows: list[dict], *names: str) -> list[tuple]:
    return [tuple(row[n] for n in names) for row in rows]


def test_by_key_over_the_last_30_days(client, ops, used):
    body = report(client, ops)
    assert (body["since"], body["until"], body["by"]) == (
        str(used["today"] - timedelta(days=29)),
        str(used["today"]),
        ["key"],
    )
    fields = ("key", "key_name", "requests", "prompt_tokens", "completion_tokens", "processing_s")
    assert sorted(figures(body["data"], *fields)) == sorted(
        [
            (used["a"].prefix, "a", 2, 15, 3, 2.0),
            (used["b"].prefix, "b", 5, 47, 11, 10.0),  # its purged day counts too
            (used["c"].prefix, "c", 1, 1, 1, 1.0),  # 40 days ago is outside
        ]
    )
    assert body["total"] == {
        "requests": 8,
        "prompt_tokens": 63,
        "completion_tokens": 15,
        "processing_s": 13.0,
    }


def test_by_team_and_by_team_and_day(client, ops, used):
    by_team = report(client, ops, "?by=team")["data"]
    assert figures(by_team, "team", "requests", "processing_s") == [
        ("research", 7, 12.0),
        (None, 1, 1.0),  # keys in no team
    ]
    today, yesterday = str(used["today"]), str(used["today"] - timedelta(days=1))
    by_day = report(client, ops, "?by=day,team&since=" + yesterday)
    assert by_day["by"] == ["team", "day"]
    assert figures(by_day["data"], "team", "day", "requests") == [
        ("research", yesterday, 1),
        ("research", today, 2),
        (None, today, 1),
    ]


def test_a_range_and_a_key_or_team_narrow_it(client, ops, used):
    long_ago = str(used["today"] - timedelta(days=45))
    old = report(client, ops, f"?since={long_ago}&until={used['today'] - timedelta(days=5)}")
    assert figures(old["data"], "key_name", "requests") == [("b", 4), ("c", 1)]
    one = report(client, ops, f"?key={used['a'].prefix}&by=day")["data"]
    assert figures(one, "requests") == [(1,), (1,)]
    team = report(client, ops, "?team=research")["total"]
    assert team["requests"] == 7


def test_as_csv_for_a_spreadsheet(client, ops, used):
    answer = client.get("/api/v1/usage?by=team&as=csv", headers=ops)
    assert answer["Content-Type"].startswith("text/csv")
    assert answer.content.decode().splitlines() == [
        "team,requests,prompt_tokens,completion_tokens,processing_s",
        "research,7,62,14,12.0",
        ",1,1,1,1.0",
    ]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("?since=yesterday", (400, "since", "invalid_value")),
        ("?until=2026-13-01", (400, "until", "invalid_value")),
        ("?by=month", (400, "by", "invalid_value")),
        ("?since=2026-11-02&until=2026-11-01", (400, "since", "invalid_value")),
        ("?since=2024-01-01&until=2026-01-01", (400, "since", "invalid_value")),
        ("?key=nosuchkey", (404, "prefix", "key_not_found")),
        ("?team=nobody", (404, "name", "team_not_found")),
    ],
)
def test_bad_input_is_a_clear_error(client, ops, used, query, expected):
    assert error_of(client.get(f"/api/v1/usage{query}", headers=ops)) == expected


def test_only_operators_read_it(client, make_key, used):
    _, secret = make_key("app")
    assert error_of(client.get("/api/v1/usage", headers=bearer(secret)))[::2] == (
        403,
        "permission_denied",
    )
    assert error_of(client.get("/api/v1/usage"))[::2] == (401, "unauthorized")


def test_the_command_prints_a_table_or_csv(used):
    out = StringIO()
    call_command("usage_report", "--by", "team", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Usage from ") and lines[0].endswith(" (UTC days)")
    assert lines[1].split() == [
        "team",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "processing_s",
    ]
    assert lines[2].split() == ["research", "7", "62", "14", "12.0"]
    assert lines[3].split() == ["-", "1", "1", "1", "1.0"]
    assert lines[4].split() == ["total", "8", "63", "15", "13.0"]
    csv_out = StringIO()
    call_command("usage_report", "--by", "key,day", "--csv", stdout=csv_out)
    assert csv_out.getvalue().splitlines()[0] == (
        "key,key_name,day,requests,prompt_tokens,completion_tokens,processing_s"
    )
    with pytest.raises(CommandError, match="cannot group by 'month'"):
        call_command("usage_report", "--by", "month", stdout=StringIO())

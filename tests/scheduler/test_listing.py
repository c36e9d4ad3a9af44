"""GET /api/v1/requests: newest first, filtered, a page at a time by cursor."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import Priority
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows():
    now = timezone.now()
    made = []
    for i, (model, state, priority) in enumerate(
        [
            ("a", "completed", Priority.NORMAL),
            ("b", "failed", Priority.INTERACTIVE),
            ("a", "pending", Priority.BACKGROUND),
            ("a", "completed", Priority.NORMAL),
            ("b", "pending", Priority.NORMAL),
        ]
    ):
        made.append(
            factories.request(
                model, priority, state=state, created_at=now - timedelta(minutes=10 - i)
            )
        )
    return made[::-1]  # newest first


def ids(body) -> list[str]:
    return [r["id"] for r in body["data"]]


def test_pages_walk_every_request_newest_first(client, rows):
    seen, cursor = [], None
    for _ in range(5):
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        body = client.get("/api/v1/requests", params).json()
        seen += ids(body)
        cursor = body["next_cursor"]
        assert body["has_more"] == (cursor is not None)
        if cursor is None:
            break
    assert seen == [str(r.pk) for r in rows]
    first = client.get("/api/v1/requests").json()["data"][0]
    assert first["url"] == f"/api/v1/requests/{rows[0].pk}"
    assert (first["model"], first["state"], first["priority"]) == ("b", "pending", "normal")


def test_filters(client, rows):
    def listed(**params):
        return ids(client.get("/api/v1/requests", params).json())

    assert listed(model="a") == [str(r.pk) for r in rows if r.model_name == "a"]
    assert listed(state="completed,failed") == [str(r.pk) for r in rows if r.is_terminal]
    assert listed(priority="interactive") == [str(rows[3].pk)]
    assert listed(model="a", state="pending") == [str(rows[2].pk)]


@pytest.mark.parametrize(
    "params, param, code",
    [
        ({"state": "lost"}, "state", "invalid_value"),
        ({"priority": "vip"}, "priority", "invalid_value"),
        ({"limit": "0"}, "limit", "invalid_value"),
        ({"limit": "many"}, "limit", "invalid_type"),
        ({"cursor": "!!not-ours"}, "cursor", "invalid_value"),
    ],
)
def test_bad_parameters_are_400(client, params, param, code):
    r = client.get("/api/v1/requests", params)
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)

"""The operator API for the line: an operator sees every request that has not ended, with
whose it is, and cancels a runaway key's flood (or a team's, a model's, chosen ids) in one
call; bad input changes nothing; only operators may call it; an operator key reads and
cancels any request by id, another key only its own."""

import logging
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from access.models import ApiKey, Team
from backends.models import Deployment
from scheduler.api import queue
from scheduler.models import Priority, Request, State
from tests import factories
from tests.access.conftest import bearer
from tests.access.test_keys_api import error_of, post

pytestmark = pytest.mark.auth
WAITING = [State.PENDING, State.NEEDS_LOADING, State.READY]


@pytest.fixture
def ops(make_key) -> dict[str, str]:
    _, secret = make_key("ops", operator=True)
    return bearer(secret)


@pytest.fixture
def line(make_key):
    """A flood from `batch` (team research), one `chat` request at its server, one that
    ended, one sent with no key (auth was off then)."""
    research = Team.objects.create(name="research")
    batch, _ = make_key("batch", team=research)
    chat, chat_secret = make_key("chat")
    srv = factories.server("gpu-a")
    dep = factories.deployment(srv, "m", state="loaded", in_flight=1)
    t0 = timezone.now() - timedelta(minutes=5)
    flood = [
        factories.request(
            "m", Priority.BACKGROUND, api_key=batch, state=state, created_at=t0 + timedelta(s)
        )
        for s, state in enumerate(WAITING)
    ]
    running = factories.request(
        "m",
        Priority.INTERACTIVE,
        api_key=chat,
        state=State.PROCESSING,
        server=srv,
        deployment=dep,
        created_at=t0 + timedelta(seconds=10),
    )
    factories.request("m", api_key=chat, state=State.COMPLETED, created_at=t0)
    anonymous = factories.request("other", Priority.HIGH, created_at=t0 + timedelta(seconds=20))
    return {
        "flood": flood,
        "running": running,
        "anonymous": anonymous,
        "batch": batch,
        "chat": chat,
        "chat_secret": chat_secret,
        "deployment": dep,
    }


def queued(client, ops, query: str = "") -> list[str]:
    answer = client.get(f"/api/v1/queue{query}", headers=ops)
    assert answer.status_code == 200, answer.content
    return [item["id"] for item in answer.json()["data"]]


def test_the_queue_lists_every_request_not_ended_in_line_order_with_whose_it_is(client, ops, line):
    answer = client.get("/api/v1/queue", headers=ops).json()
    ids = [item["id"] for item in answer["data"]]
    flood = [str(r.pk) for r in line["flood"]]
    # By class, then arrival: interactive, high, then the background flood; the ended one not.
    assert ids == [str(line["running"].pk), str(line["anonymous"].pk), *flood]
    first, second, third = answer["data"][:3]
    assert (first["state"], first["server"], first["key_name"], first["team"]) == (
        "processing",
        "gpu-a",
        "chat",
        None,
    )
    assert first["key"] == line["chat"].prefix
    assert (second["key"], second["team"]) == (None, None)
    assert (third["key_name"], third["team"], third["priority"]) == (
        "batch",
        "research",
        "background",
    )

    assert queued(client, ops, f"?key={line['batch'].prefix}") == flood
    assert queued(client, ops, "?team=research") == flood
    assert queued(client, ops, "?team=") == [str(line["running"].pk), str(line["anonymous"].pk)]
    assert queued(client, ops, "?state=processing") == [str(line["running"].pk)]
    assert queued(client, ops, "?model=other") == [str(line["anonymous"].pk)]
    assert queued(client, ops, "?priority=background&state=pending,ready") == [
        flood[0],
        flood[2],
    ]
    page = client.get("/api/v1/queue?limit=2", headers=ops).json()
    rest = queued(client, ops, f"?cursor={page['next_cursor']}")
    assert [i["id"] for i in page["data"]] + rest == ids


@pytest.mark.parametrize(
    "query, expected",
    [
        ("?state=completed", (400, "state", "invalid_value")),
        ("?state=asleep", (400, "state", "invalid_value")),
        ("?priority=urgent", (400, "priority", "invalid_value")),
        ("?key=nosuchkey", (404, "prefix", "key_not_found")),
        ("?team=nobody", (404, "name", "team_not_found")),
        ("?limit=0", (400, "limit", "invalid_value")),
    ],
)
def test_a_bad_queue_filter_is_a_clear_error(client, ops, line, query, expected):
    assert error_of(client.get(f"/api/v1/queue{query}", headers=ops)) == expected


def test_cancelling_a_keys_flood_leaves_everyone_else_alone(client, ops, line, caplog):
    caplog.set_level(logging.INFO, logger="scheduler.api.queue")
    body = {"key": line["batch"].prefix, "reason": "runaway loop"}
    answer = post(client, "/api/v1/queue/cancel", body, ops)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"cancelled": 3, "remaining": 0}
    said = f"cancelled by key ops (sy-{ApiKey.objects.get(name='ops').prefix}…): runaway loop"
    for r in line["flood"]:
        r.refresh_from_db()
        assert r.state == State.CANCELLED
        assert r.traces.order_by("at", "id").last().reason == said
    assert Request.objects.get(pk=line["running"].pk).state == State.PROCESSING
    assert Request.objects.get(pk=line["anonymous"].pk).state == State.PENDING
    assert "3 request(s) cancelled by key ops" in caplog.text

    # Again: nothing left to cancel.
    assert post(client, "/api/v1/queue/cancel", body, ops).json() == {
        "cancelled": 0,
        "remaining": 0,
    }


def test_cancelling_with_processing_stops_those_at_their_servers_too(client, ops, line):
    answer = post(client, "/api/v1/queue/cancel", {"team": "", "processing": True}, ops)
    assert answer.json() == {"cancelled": 2, "remaining": 0}
    assert Request.objects.get(pk=line["running"].pk).state == State.CANCELLED
    assert Deployment.objects.get(pk=line["deployment"].pk).in_flight == 0  # its slot freed
    assert Request.objects.get(pk=line["anonymous"].pk).state == State.CANCELLED
    assert set(
        Request.objects.filter(pk__in=[r.pk for r in line["flood"]]).values_list("state", flat=True)
    ) == set(WAITING)


def test_a_large_cancel_goes_a_bounded_number_at_a_time(client, ops, line, monkeypatch):
    monkeypatch.setattr(queue, "MAX_CANCELS", 2)
    cancel = {"all": True}
    assert post(client, "/api/v1/queue/cancel", cancel, ops).json() == {
        "cancelled": 2,
        "remaining": 2,
    }
    assert post(client, "/api/v1/queue/cancel", cancel, ops).json() == {
        "cancelled": 2,
        "remaining": 0,
    }
    assert not Request.objects.filter(state__in=WAITING).exists()
    assert Request.objects.get(pk=line["running"].pk).state == State.PROCESSING


def test_cancelling_chosen_ids_and_a_model(client, ops, line):
    chosen = [str(line["flood"][1].pk), str(line["running"].pk)]
    # The processing one is left alone without `processing`.
    assert post(client, "/api/v1/queue/cancel", {"ids": chosen}, ops).json()["cancelled"] == 1
    assert Request.objects.get(pk=line["flood"][1].pk).state == State.CANCELLED
    assert post(client, "/api/v1/queue/cancel", {"model": "other"}, ops).json()["cancelled"] == 1
    assert Request.objects.get(pk=line["anonymous"].pk).state == State.CANCELLED


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({}, None, "missing"),
        ({"processing": True}, None, "missing"),
        ({"key": ""}, "key", None),
        ({"key": "nosuchkey"}, "prefix", "key_not_found"),
        ({"team": "nobody"}, "name", "team_not_found"),
        ({"priority": "urgent"}, "priority", "invalid_value"),
        ({"ids": ["not-a-uuid"]}, "ids", None),
        ({"all": "maybe"}, "all", None),
        ({"all": True, "reason": "x" * 201}, "reason", None),
        ({"all": True, "modle": "a"}, "modle", "invalid"),  # not every request: a typo
    ],
)
def test_a_bad_cancel_changes_nothing(client, ops, line, body, param, code):
    before = sorted(Request.objects.values_list("pk", "state"))
    answer = post(client, "/api/v1/queue/cancel", body, ops)
    status, said_param, said_code = error_of(answer)
    assert status in (400, 404) and said_param == param, answer.content
    if code is not None:
        assert said_code == code
    assert sorted(Request.objects.values_list("pk", "state")) == before


def test_only_operators_see_or_cancel_the_queue(client, line):
    chat = bearer(line["chat_secret"])
    assert error_of(client.get("/api/v1/queue", headers=chat))[::2] == (403, "permission_denied")
    assert error_of(client.get("/api/v1/queue"))[::2] == (401, "unauthorized")
    refused = post(client, "/api/v1/queue/cancel", {"all": True}, chat)
    assert error_of(refused)[::2] == (403, "permission_denied")
    assert Request.objects.filter(state=State.CANCELLED).count() == 0


def test_an_operator_key_reads_and_cancels_any_request_another_key_only_its_own(served, make_key):
    # Its one server is disabled: the job waits, for as long as it asks to.
    factories.deployment(factories.server("off", enabled=False), "nowhere")
    sy = served(SWITCHYARD_AUTH="required")
    _, alice = make_key("alice")
    _, bob = make_key("bob")
    _, ops = make_key("ops", operator=True)
    job = {
        "body": {"model": "nowhere", "messages": [{"role": "user", "content": "hi"}]},
        "no_server_grace_s": 600,
    }
    sent = httpx.post(f"{sy.url}/api/v1/requests", headers=bearer(alice), json=job)
    url = sy.url + sent.headers["Location"]
    for method in ["GET", "DELETE"]:
        assert httpx.request(method, url, headers=bearer(bob)).status_code == 404
    assert httpx.get(url, headers=bearer(ops)).json()["state"] == "pending"
    assert httpx.delete(url, headers=bearer(ops)).json()["state"] == "cancelled"
    # Its own list stays its own: the operator key sent nothing.
    assert httpx.get(f"{sy.url}/api/v1/requests", headers=bearer(ops)).json()["data"] == []

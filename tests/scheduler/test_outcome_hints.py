"""A move to a terminal state tells its caller the answer in the hint itself, so that the
waiting view answers without reading the row again; a hint that tells too little sends it
back to the row."""

import uuid

import pytest

from scheduler import channel_hints
from scheduler.api.waiting import told_outcome
from scheduler.models import State
from scheduler.transitions import MAX_HINTED_RESULT_BYTES, move
from tests import factories

S = State
RESULT = {"object": "chat.completion", "choices": [{"message": {"content": "hi"}}]}


def hint(state: str, **outcome) -> dict:
    return {"type": "request.moved", "id": "x", "state": state, "outcome": outcome}


def test_a_completed_hint_is_the_answer():
    request_id = uuid.uuid4()
    told = told_outcome(request_id, hint(S.COMPLETED, result=RESULT))
    assert (told.pk, told.state, told.result) == (request_id, S.COMPLETED, RESULT)


def test_a_failed_hint_carries_its_error():
    told = told_outcome(uuid.uuid4(), hint(S.FAILED, error="boom", error_code="load_failed"))
    assert (told.state, told.error, told.error_code) == (S.FAILED, "boom", "load_failed")


def test_a_cancel_needs_nothing_more():
    assert told_outcome(uuid.uuid4(), hint(S.CANCELLED)).state == S.CANCELLED


@pytest.mark.parametrize(
    "message",
    [
        hint(S.COMPLETED),  # the result was too large to carry
        hint(S.FAILED, error_code="x"),
        hint(S.EXPIRED),
        hint(S.READY),
        {"type": "request.moved", "id": "x", "state": S.COMPLETED},  # an older sender
    ],
)
def test_a_hint_that_tells_too_little_means_reading_the_row(message):
    assert told_outcome(uuid.uuid4(), message) is None


@pytest.fixture
def announced(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(channel_hints, "request_moved", lambda *args: calls.append(args))
    return calls


@pytest.mark.django_db
def test_completing_announces_the_result_after_commit(
    announced, django_capture_on_commit_callbacks
):
    request = factories.request("m1", state=S.PROCESSING)
    with django_capture_on_commit_callbacks(execute=True):
        assert move(request.pk, [S.PROCESSING], S.COMPLETED, "done", result=RESULT)
        assert announced == []  # not before commit
    assert announced == [(request.pk, S.COMPLETED, {"result": RESULT})]


@pytest.mark.django_db
def test_a_large_result_stays_in_the_row(announced, django_capture_on_commit_callbacks):
    request = factories.request("m1", state=S.PROCESSING)
    big = {"data": "x" * MAX_HINTED_RESULT_BYTES}
    with django_capture_on_commit_callbacks(execute=True):
        move(request.pk, [S.PROCESSING], S.COMPLETED, "done", result=big)
    assert announced == [(request.pk, S.COMPLETED, {})]
    request.refresh_from_db()
    assert request.result == big


@pytest.mark.django_db
def test_a_move_that_does_not_finish_carries_no_outcome(
    announced, django_capture_on_commit_callbacks
):
    request = factories.request("m1")
    with django_capture_on_commit_callbacks(execute=True):
        move(request.pk, [S.PENDING], S.READY, "routed")
    assert announced == [(request.pk, S.READY, None)]


@pytest.mark.django_db
def test_a_requests_group_hears_of_its_end_and_the_dashboard_of_every_move(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        channel_hints, "send_from_sync", lambda group, msg: sent.append((group, msg))
    )
    request = factories.request("m1")
    own = channel_hints.request_group(request.pk)
    with django_capture_on_commit_callbacks(execute=True):
        move(request.pk, [S.PENDING], S.READY, "routed")
    assert [group for group, _ in sent] == [channel_hints.DASHBOARD_GROUP]

    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        move(request.pk, [S.READY], S.CANCELLED, "the caller hung up")
    assert sent[0] == (
        own,
        {"type": "request.moved", "id": str(request.pk), "state": S.CANCELLED, "outcome": {}},
    )
    assert [group for group, _ in sent[1:]] == [channel_hints.DASHBOARD_GROUP]

"""Accepting a request stores the whole row (written as SQL, read back through the ORM)."""

from collections import Counter
from datetime import timedelta

import pytest

from scheduler.api import intake
from scheduler.api.errors import ApiError
from scheduler.api.queue_bound import queue_bound
from scheduler.models import Priority, Request, State
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("asked_for", ["qwen3-8b", "qwen"])
def test_an_accepted_request_is_stored_whole_by_name_or_alias(asked_for) -> None:
    model = factories.model("qwen3-8b", aliases=["qwen"])
    body = {"model": asked_for, "messages": [{"role": "user", "content": "hi"}], "stream": True}

    accepted = intake.accept("chat", body, "high")

    stored = Request.objects.get()
    assert (stored.pk, accepted.model_id) == (accepted.pk, model.pk)
    assert (stored.model_id, stored.model_name, stored.kind) == (model.pk, asked_for, "chat")
    assert (stored.state, stored.priority, stored.stream) == (State.PENDING, Priority.HIGH, True)
    assert stored.payload == body
    assert stored.created_at == accepted.created_at
    assert stored.expires_at - stored.created_at == timedelta(
        seconds=intake.max_wait_s(Priority.HIGH)
    )
    assert (stored.attempts, stored.result, stored.error, stored.worker_id) == (0, None, "", None)
    assert stored.traces.count() == 0


@pytest.mark.parametrize("asked_for, stored", [("qwen3-8b", 1), ("qwen", 1), ("nope", 0)])
def test_the_queue_bound_counts_what_was_stored_once(asked_for, stored, knobs, monkeypatch):
    """A name no model has stores nothing on the first try (the insert looks the model up
    itself); that try is not counted as waiting, whether an alias then stores it or not."""
    factories.model("qwen3-8b", aliases=["qwen"])
    knobs(MAX_QUEUE=1000)
    monkeypatch.setattr(queue_bound, "counted_at", float("inf"))  # the count stays fresh
    monkeypatch.setattr(queue_bound, "waiting", Counter())
    body = {"model": asked_for, "messages": [{"role": "user", "content": "hi"}]}

    try:
        intake.accept("chat", body)
    except ApiError as error:
        assert (error.status, error.code) == (404, "model_not_found")

    assert Request.objects.count() == stored
    assert sum(queue_bound.waiting.values()) == stored

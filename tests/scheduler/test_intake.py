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


PICTURE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
ASKED_WITH_AN_IMAGE = {
    "chat": {"messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, PICTURE]}]},
    "message": {
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}
        ],
    },
    "response": {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
}


@pytest.mark.parametrize("kind", list(ASKED_WITH_AN_IMAGE))
def test_images_for_a_model_known_to_take_none_are_refused_and_nothing_stored(kind) -> None:
    """Known: refused before any load is started for it. Unknown, or a model with vision:
    stored, for its server to answer."""
    factories.model("text", aliases=["t"], capabilities=["tools"])
    factories.model("unknown")
    factories.model("seeing", capabilities=["vision"])
    body = ASKED_WITH_AN_IMAGE[kind]

    with pytest.raises(ApiError) as refused:
        intake.accept(kind, {"model": "t", **body})

    assert (refused.value.status, refused.value.code) == (400, "images_not_supported")
    assert "does not take images (it takes tools)" in refused.value.message
    assert Request.objects.count() == 0
    intake.accept(kind, {"model": "unknown", **body})
    intake.accept(kind, {"model": "seeing", **body})
    intake.accept(kind, {"model": "t", **body, **TEXT_ONLY[kind]})
    assert Request.objects.count() == 3


TEXT_ONLY = {
    "chat": {"messages": [{"role": "user", "content": [{"type": "text", "text": "?"}]}]},
    "message": {"messages": [{"role": "user", "content": "?"}]},
    "response": {"input": "?"},
}

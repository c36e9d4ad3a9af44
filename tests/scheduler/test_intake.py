"""Accepting a request stores the whole row (written as SQL, read back through the ORM)."""

from datetime import timedelta

import pytest

from scheduler.api import intake
from scheduler.models import Priority, Request, State
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("asked_for", ["qwen3-8b", "qwen"])
def test_an_accepted_request_is_stored_whole_by_name_or_alias(asked_for) -> None:
    model = factories.model("qwen3-8b", aliases=["qwen"])
    body = {"model": asked_for, "messages": [{"role": "user", "content": "hi"}], "stream": True}

    accepted = intake.accept("chat", body, "high")

    stored = Request.objects.get()
    assert stored.pk == accepted.pk
    assert (stored.model_id, stored.model_name, stored.kind) == (model.pk, asked_for, "chat")
    assert (stored.state, stored.priority, stored.stream) == (State.PENDING, Priority.HIGH, True)
    assert stored.payload == body
    assert stored.created_at == accepted.created_at
    assert stored.expires_at - stored.created_at == timedelta(
        seconds=intake.max_wait_s(Priority.HIGH)
    )
    assert (stored.attempts, stored.result, stored.error, stored.worker_id) == (0, None, "", None)
    assert stored.traces.count() == 0

"""A batch in the database: stored whole with its requests or not at all, and ended into
an output file and an error file once its last request has ended."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from access import limits
from batches import lines, store
from batches.models import Batch, File
from scheduler import retention
from scheduler.api.errors import ApiError
from scheduler.api.queue_bound import QueueBound
from scheduler.models import Priority, Request, State
from tests import factories

pytestmark = pytest.mark.django_db


def text_of(*custom_ids: str) -> str:
    return "".join(
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m1", "messages": [{"role": "user", "content": cid}]},
            }
        )
        + "\n"
        for cid in custom_ids
    )


def new_batch(*custom_ids: str, api_key=None) -> Batch:
    factories.model("m1")
    text = text_of(*custom_ids)
    source = File.objects.create(purpose="batch", filename="in.jsonl", content=text)
    found = lines.parse(text, "chat", "/v1/chat/completions", api_key, most=100)
    return store.create(api_key, "chat", "/v1/chat/completions", source, found, None)


def end_as(batch: Batch, custom_id: str, state: str, **fields) -> None:
    Request.objects.filter(batch_item__batch=batch, batch_item__custom_id=custom_id).update(
        state=state, finished_at=timezone.now(), **fields
    )


def read(batch: Batch) -> Batch:
    """As the API reads it: ended first if its last request has, with its counts."""
    store.end_finished(Batch.objects.filter(pk=batch.pk))
    return store.with_counts(Batch.objects.filter(pk=batch.pk)).get()


def content(file_id: str) -> list[dict]:
    return [json.loads(line) for line in File.objects.get(pk=file_id).content.splitlines()]


def test_its_requests_wait_a_day_even_while_no_server_can_serve_them():
    new_batch("a", "b")
    for r in Request.objects.all():
        assert (r.expires_at - r.created_at).total_seconds() == 86_400
        assert r.no_server_grace_s == 86_400 and r.priority == 3 and not r.stream


def test_it_stays_in_progress_until_its_last_request_ends():
    batch = new_batch("a", "b")
    end_as(batch, "a", State.COMPLETED, result={"id": "x"})
    assert read(batch).status == Batch.Status.IN_PROGRESS
    assert store.counts(read(batch)) == {"total": 2, "completed": 1, "failed": 0}


def test_answers_and_errors_go_to_two_files_in_line_order():
    batch = new_batch("ok", "bad", "late")
    end_as(batch, "ok", State.COMPLETED, result={"choices": []})
    end_as(batch, "bad", State.FAILED, error="no such model", error_code="not_found")
    end_as(batch, "late", State.EXPIRED, error="waited 24 h")
    ended = read(batch)
    assert ended.status == Batch.Status.EXPIRED  # not every request could run in its day
    [answer] = content(ended.output_file_id)
    assert answer["custom_id"] == "ok" and answer["response"]["body"] == {"choices": []}
    bad, late = content(ended.error_file_id)
    assert bad["response"]["status_code"] == 404
    assert bad["response"]["body"]["error"]["code"] == "not_found"
    assert late["response"] is None and late["error"]["code"] == "batch_expired"
    assert store.counts(ended) == {"total": 3, "completed": 1, "failed": 2}
    # Read again: ended once, its files written once.
    assert read(ended).output_file_id == ended.output_file_id
    assert File.objects.filter(purpose="batch_output").count() == 2


def test_a_cancelled_batch_cancels_what_waits_and_keeps_what_was_answered():
    batch = new_batch("done", "waiting")
    end_as(batch, "done", State.COMPLETED, result={"choices": []})
    store.cancel(batch, "cancelled with its batch")
    ended = read(batch)
    assert ended.status == Batch.Status.CANCELLED and ended.cancelling_at is not None
    assert [a["custom_id"] for a in content(ended.output_file_id)] == ["done"]
    [cancelled] = content(ended.error_file_id)
    assert cancelled["error"]["code"] == "batch_cancelled"


def test_a_batch_counts_against_no_queue_bound_and_no_keys_pace(knobs, make_key):
    """One call made it: its lines must not lock interactive callers out of a bounded
    queue, nor its key out of its own requests per minute and requests waiting."""
    knobs(MAX_QUEUE=1)
    api_key, _ = make_key("batch-jobs", rpm=1, max_waiting=1)
    new_batch("a", "b", "c", api_key=api_key)
    assert Request.objects.filter(in_batch=True).count() == 3
    bound = QueueBound()
    bound.admit(Priority.INTERACTIVE)  # nothing else waits
    limits.check_pace(api_key, timezone.now())
    factories.request("m1", api_key=api_key)  # one of its own, sent one at a time
    with pytest.raises(ApiError) as refused:
        limits.check_pace(api_key, timezone.now())
    assert refused.value.code == "rate_limited"
    bound.count()
    with pytest.raises(ApiError) as full:
        bound.admit(Priority.INTERACTIVE)
    assert full.value.code == "queue_full"


def test_a_batch_holds_at_most_its_setting_of_requests():
    factories.model("m1")
    with pytest.raises(ApiError) as refused:
        lines.parse(text_of("a", "b", "c"), "chat", "/v1/chat/completions", None, most=2)
    assert "at most 2 requests" in refused.value.message


def test_the_admin_lists_batches_with_their_progress_and_cancels_them(admin_client):
    batch = new_batch("a", "b")
    end_as(batch, "a", State.COMPLETED, result={"choices": []})
    page = admin_client.get(reverse("admin:batches_batch_changelist")).content.decode()
    assert batch.id in page and "1 / 0 of 2" in page and "In Progress" in page
    action = {"action": "cancel", "_selected_action": [batch.id]}
    answer = admin_client.post(reverse("admin:batches_batch_changelist"), action, follow=True)
    assert "Cancelled 1 batch(es)." in answer.content.decode()
    assert read(batch).status == Batch.Status.CANCELLED
    reasons = Request.objects.get(state=State.CANCELLED).traces.values_list("reason", flat=True)
    assert any(f"cancelled with its batch {batch.id} in admin by" in r for r in reasons)


@pytest.mark.parametrize("name", ["batch", "file"])
def test_list_pages_do_not_query_per_row(admin_client, django_assert_max_num_queries, name):
    url = reverse(f"admin:batches_{name}_changelist")
    new_batch("a", "b")
    with CaptureQueriesContext(connection) as one_row:
        assert admin_client.get(url).status_code == 200
    for i in range(10):
        new_batch(f"x{i}", f"y{i}")
    with django_assert_max_num_queries(len(one_row)):
        assert admin_client.get(url).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_retention_purges_a_batch_request_and_the_batch_still_ends():
    """Committed, as the worker's purge is (a key left naming the request would refuse it
    on PostgreSQL). The purged line is an error of its own."""
    batch = new_batch("old", "new")
    long_ago = timezone.now() - timedelta(days=40)
    end_as(batch, "old", State.COMPLETED, result={"choices": []})
    Request.objects.filter(batch_item__custom_id="old").update(finished_at=long_ago)
    end_as(batch, "new", State.COMPLETED, result={"choices": []})
    assert retention.purge_finished(timezone.now() - timedelta(days=30)) == 1
    ended = read(batch)
    assert ended.status == Batch.Status.COMPLETED
    assert store.counts(ended) == {"total": 2, "completed": 1, "failed": 1}
    assert [a["custom_id"] for a in content(ended.output_file_id)] == ["new"]
    [purged] = content(ended.error_file_id)
    assert (purged["custom_id"], purged["error"]["code"]) == ("old", "request_purged")


def test_a_line_for_a_model_the_key_may_not_use_refuses_the_batch(make_key):
    factories.model("m1")
    api_key, _ = make_key("narrow", allowed_models=["other"])
    with pytest.raises(ApiError) as refused:
        lines.parse(text_of("a", "b"), "chat", "/v1/chat/completions", api_key, most=10)
    assert (refused.value.status, refused.value.code) == (403, "model_not_allowed")
    assert refused.value.message.startswith("Line 1: ")

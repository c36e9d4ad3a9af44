"""Storing a batch (its requests with it, in one transaction) and ending it: once its last
request has ended, its answers and errors are written as two files."""

import json
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from access import limits
from access.models import ApiKey
from scheduler import wakeup
from scheduler.api.inference import error_of
from scheduler.models import TERMINAL_STATES, WAITING_STATES, Priority, Request, State
from scheduler.store.completion import cancel_request

from .lines import Line
from .models import Batch, BatchItem, File

WINDOW = timedelta(hours=24)  # the one completion window OpenAI's API offers: "24h"


def create(
    api_key: ApiKey | None,
    kind: str,
    endpoint: str,
    input_file: File,
    lines: list[Line],
    metadata: dict | None,
) -> Batch:
    """The batch and one background request a line, waiting until its window ends (also
    while no server can serve its model: a batch has the day)."""
    with transaction.atomic():
        now = timezone.now()
        if api_key is not None:
            limits.check_daily_quotas(api_key, now)
        batch = Batch.objects.create(
            api_key=api_key,
            endpoint=endpoint,
            input_file_id=input_file.id,
            metadata=metadata,
            total=len(lines),
            created_at=now,
            expires_at=now + WINDOW,
        )
        requests = Request.objects.bulk_create(
            Request(
                kind=kind,
                model_name=line.body["model"],
                model=line.model,
                payload=line.body,
                priority=Priority.BACKGROUND,
                api_key=api_key,
                created_at=now,
                expires_at=now + WINDOW,
                no_server_grace_s=WINDOW.total_seconds(),
                in_batch=True,
            )
            for line in lines
        )
        BatchItem.objects.bulk_create(
            BatchItem(batch=batch, line=line.number, custom_id=line.custom_id, request=request)
            for line, request in zip(lines, requests, strict=True)
        )
        wakeup.notify_in_transaction()
        transaction.on_commit(wakeup.wake_local)
    return batch


def cancel(batch: Batch, reason: str) -> None:
    """Mark the batch cancelling, then cancel each of its requests not yet ended (one at
    its server stops there)."""
    marked = Batch.objects.filter(pk=batch.pk, status=Batch.Status.IN_PROGRESS).update(
        status=Batch.Status.CANCELLING, cancelling_at=timezone.now()
    )
    if not marked:
        return
    open_ids = Request.objects.filter(batch_item__batch=batch).exclude(state__in=TERMINAL_STATES)
    for request_id in open_ids.values_list("pk", flat=True):
        cancel_request(request_id, reason)


OPEN = (Batch.Status.IN_PROGRESS, Batch.Status.CANCELLING)
NOT_ENDED = [*WAITING_STATES, State.PROCESSING]


def with_counts(rows: QuerySet[Batch]) -> QuerySet[Batch]:
    """The batches with their requests counted in the same query: `completed`, and `left`
    (not ended yet; a request purged by retention has ended)."""
    return rows.annotate(
        completed=Count("items", filter=Q(items__request__state=State.COMPLETED)),
        left=Count("items", filter=Q(items__request__state__in=NOT_ENDED)),
    )


def counts(batch: Batch) -> dict[str, int]:
    """OpenAI's `request_counts` of a batch read `with_counts`: total, completed, failed
    (failed, expired, cancelled or purged)."""
    failed = batch.total - batch.left - batch.completed
    return {"total": batch.total, "completed": batch.completed, "failed": failed}


def end_finished(rows: QuerySet[Batch]) -> None:
    """End the open batches among `rows` whose last request has ended: a batch ends when
    it is next read (the API, the admin), so the worker needs to know nothing of them."""
    for batch in with_counts(rows.filter(status__in=OPEN)):
        if batch.left == 0:
            with transaction.atomic():
                locked = Batch.objects.select_for_update().filter(pk=batch.pk, status__in=OPEN)
                if (found := locked.first()) is not None:  # else another call ended it
                    end(found)


def end(batch: Batch) -> None:
    answers, errors, expired = [], [], False
    last: datetime | None = None
    for item in batch.items.select_related("request").order_by("line"):
        request = item.request
        if request is None:  # purged by retention before the batch was read
            errors.append(line_of(item, None, {"code": "request_purged", "message": "purged"}))
            continue
        last = max(filter(None, (last, request.finished_at)), default=None)
        if request.state == State.COMPLETED:
            response = {"status_code": 200, "request_id": str(request.pk), "body": request.result}
            answers.append(line_of(item, response, None))
        elif request.state == State.FAILED:
            error = error_of(request)
            response = {
                "status_code": error.status,
                "request_id": str(request.pk),
                "body": error.body(),
            }
            errors.append(line_of(item, response, None))
        else:
            expired = expired or request.state == State.EXPIRED
            code = "batch_expired" if request.state == State.EXPIRED else "batch_cancelled"
            why = request.error or f"the request was {request.state}"
            errors.append(line_of(item, None, {"code": code, "message": why}))
    batch.output_file_id = write_file(batch, "output", answers)
    batch.error_file_id = write_file(batch, "error", errors)
    if batch.status == Batch.Status.CANCELLING:
        batch.status = Batch.Status.CANCELLED
    else:
        batch.status = Batch.Status.EXPIRED if expired else Batch.Status.COMPLETED
    batch.ended_at = last or timezone.now()
    batch.save()


def line_of(item: BatchItem, response: dict | None, error: dict | None) -> str:
    request_id = item.request_id.hex if item.request_id else f"{item.batch_id}-{item.line}"
    return json.dumps(
        {
            "id": f"batch_req_{request_id}",
            "custom_id": item.custom_id,
            "response": response,
            "error": error,
        }
    )


def write_file(batch: Batch, which: str, lines: list[str]) -> str:
    """The id of a new file of `lines` (empty: none, as OpenAI's batches have no error file
    when nothing failed)."""
    if not lines:
        return ""
    content = "".join(f"{line}\n" for line in lines)
    made = File.objects.create(
        api_key_id=batch.api_key_id,
        purpose=File.Purpose.BATCH_OUTPUT,
        filename=f"{batch.id}_{which}.jsonl",
        content=content,
        bytes=len(content.encode()),
    )
    return made.id

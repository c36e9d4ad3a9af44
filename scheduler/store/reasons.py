"""Storing why requests wait (`scheduler/reasons.py`): only what changed, in one transaction.

A pass explains every request of its snapshot still waiting. The worker remembers what it
wrote last for each (as many as the snapshot holds: a deep line's heads, never its tail),
and writes only the reasons that changed: the request's `reason` field, in one UPDATE, and a
trace row, in one INSERT (a line moving forward, "behind 3 …" then "behind 2 …", changes the
field only; a new kind of reason is traced). A request no longer waiting is left alone: the
rows are read under lock first, in id order as every writer locks requests
(docs/architecture.md). A pass that changes no reason writes nothing."""

from collections.abc import Mapping
from datetime import datetime
from uuid import UUID

from django.utils import timezone

from .. import channel_hints, sql
from ..models import WAITING_STATES, Request, Trace
from ..reasons import BEHIND, Reason

PER_STATEMENT = 200  # requests per UPDATE and INSERT: within SQLite's limit on parameters


class ReasonWriter:
    """What this worker wrote last, per waiting request it saw."""

    def __init__(self) -> None:
        self.written: dict[UUID, Reason] = {}

    def changed(self, reasons: Mapping[UUID, Reason]) -> list[tuple[UUID, Reason, bool]]:
        """The reasons to write (each with whether to trace it); forgets the requests that
        no longer wait in the snapshot's view."""
        changes = []
        for rid, reason in reasons.items():
            last = self.written.get(rid)
            if last is None or (last.kind, last.text) != (reason.kind, reason.text):
                traced = last is None or last.kind != reason.kind or reason.kind != BEHIND
                changes.append((rid, reason, traced))
        self.written = dict(reasons)
        return changes


def write_reasons(changes: list[tuple[UUID, Reason, bool]]) -> None:
    """In the database thread: store the changed reasons (`ReasonWriter.changed`), after the
    pass's moves (a trace row follows the move that led to it)."""
    with sql.atomic():
        sql.without_waiting_for_disk()  # lost in a crash, the next pass writes it again
        for chunk in sql.chunks(changes, PER_STATEMENT):
            _write(chunk, timezone.now())
    channel_hints.dashboard_changed()  # the pages that show them read them again


def _write(changes: list[tuple[UUID, Reason, bool]], now: datetime) -> None:
    by_id = {rid: (reason, traced) for rid, reason, traced in changes}
    still_waiting = (
        Request.objects.filter(pk__in=by_id, state__in=WAITING_STATES)
        .order_by("pk")
        .select_for_update()
        .values_list("pk", "state")
    )
    states = dict(still_waiting)
    Request.objects.bulk_update(
        [Request(pk=rid, reason=by_id[rid][0].as_json()) for rid in states], ["reason"]
    )
    Trace.objects.bulk_create(
        Trace(
            request_id=rid,
            at=now,
            from_state=state,
            to_state=state,
            server=reason.detail("server") or "",
            reason=reason.text,
        )
        for rid, state in states.items()
        for reason, traced in [by_id[rid]]
        if traced
    )

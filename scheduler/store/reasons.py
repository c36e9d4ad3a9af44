"""Storing why requests wait (`scheduler/reasons.py`): only what changed, in one transaction.

A pass explains every request of its snapshot still waiting. The worker remembers what it
wrote last for each (as many as the snapshot holds: a deep line's heads, never its tail),
and writes only the reasons that changed: the request's `reason` field, in one UPDATE, and a
trace row, in one INSERT (a line moving forward, "behind 3 …" then "behind 2 …", changes the
field only; a new kind of reason is traced). Both find their rows by key and leave alone a
request no longer waiting. On PostgreSQL the rows are locked first in id order, as every
writer locks requests (docs/architecture.md), and the whole is one round trip. A pass that
changes no reason writes nothing."""

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from django.utils import timezone

from .. import channel_hints, sql
from ..models import WAITING_STATES, Request, Trace
from ..reasons import BEHIND, Reason
from ..transitions import REQUESTS, TRACE_INSERT, locking

PER_STATEMENT = 200  # requests per UPDATE and INSERT: within SQLite's limit on parameters
WAITING = f"state IN ({', '.join(repr(str(s.value)) for s in WAITING_STATES)})"


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
    keys = sql.keys(Request, [rid for rid, _, _ in changes])
    by_key = list(zip(keys, changes, strict=True))
    sql.write_later(*locking("id", sorted(keys, key=str)))
    values = [(k, sql.db_value(Request, "reason", r.as_json())) for k, (_, r, _) in by_key]
    sql.write_later(
        f"UPDATE {REQUESTS} SET reason = {_case(len(values))}"
        f" WHERE id IN ({sql.marks(len(keys))}) AND {WAITING}",
        [*_flat(values), *keys],
    )
    traced = [(k, r) for k, (_, r, trace) in by_key if trace]
    if not traced:
        return
    servers = [(k, r.detail("server") or "") for k, r in traced]
    texts = [(k, r.text) for k, r in traced]
    ids = [k for k, _ in traced]
    sql.write_later(
        f"{TRACE_INSERT} SELECT id, %s, state, state, {_case(len(servers))}, {_case(len(texts))}"
        f" FROM {REQUESTS} WHERE id IN ({sql.marks(len(ids))}) AND {WAITING}",
        [sql.db_value(Trace, "at", now), *_flat(servers), *_flat(texts), *ids],
    )


def _case(n: int) -> str:
    return f"CASE id {' '.join(['WHEN %s THEN %s'] * n)} END"


def _flat(pairs: list[tuple[Any, Any]]) -> list[Any]:
    return [v for pair in pairs for v in pair]

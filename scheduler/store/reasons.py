"""Storing why requests wait (`scheduler/reasons.py`): only what changed, in one transaction.

A pass explains every request of its snapshot still waiting. The worker remembers what it
gave last for each (as many as the snapshot holds: a deep line's heads, never its tail), and
sends on only the reasons that changed since. Those are compared with the stored ones, read
under lock in id order as every writer locks requests (docs/architecture.md): a request no
longer waiting is left alone, and one whose stored reason already says the same (another
worker's pass, or this worker's before a restart) too. The rest are written: the `reason`
field in one UPDATE and a trace row in one INSERT when it says something new: a new kind, or
new words (a line moving forward, "behind 3 …" then "behind 2 …", or any reason whose
numbers alone move, a count or a time, changes the field only). A pass that changes no
reason writes nothing."""

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from uuid import UUID

from django.utils import timezone

from .. import channel_hints, sql
from ..decisions import Decision, Expire
from ..models import WAITING_STATES, Request, Trace
from ..reasons import BEHIND, Reason

NUMBER = re.compile(r"\b\d+(?:[.:]\d+)*\b")  # a count, a duration, a time; not s1, qwen3
PER_STATEMENT = 200  # requests per UPDATE and INSERT: within SQLite's limit on parameters


class ReasonWriter:
    """What this worker gave last, per waiting request it saw."""

    def __init__(self) -> None:
        self.written: dict[UUID, Reason] = {}

    def changed(self, reasons: Mapping[UUID, Reason]) -> dict[UUID, Reason]:
        """The reasons that differ from what this worker gave last; forgets the requests
        that no longer wait in the snapshot's view."""
        changes = {}
        for rid, reason in reasons.items():
            last = self.written.get(rid)
            if last is None or (last.kind, last.text) != (reason.kind, reason.text):
                changes[rid] = reason
        self.written = dict(reasons)
        return changes

    def with_last_reasons(self, decisions: list[Decision]) -> list[Decision]:
        """Each `Expire` saying what its request last waited for, as this worker gave it:
        "still waiting after 120 s" alone tells its caller nothing it can act on."""
        told = []
        for d in decisions:
            if isinstance(d, Expire) and (last := self.written.get(d.request_id)) is not None:
                d = replace(d, reason=f"{d.reason} (last: {last.text})")
            told.append(d)
        return told


def said(text: str | None) -> str | None:
    """A reason's text without its numbers: "finishes the 3 running" and "the 2 running"
    say the same thing (the field follows each count; the trace, each new thing said)."""
    return None if text is None else NUMBER.sub("#", text)


def write_reasons(changes: Mapping[UUID, Reason]) -> None:
    """In the database thread: store the changed reasons (`ReasonWriter.changed`), after the
    pass's moves (a trace row follows the move that led to it)."""
    with sql.atomic():
        sql.without_waiting_for_disk()  # lost in a crash, the next pass writes it again
        # In id order across the chunks too: each chunk locks its rows, and the lock order
        # holds for the whole transaction.
        for chunk in sql.chunks(sorted(changes.items()), PER_STATEMENT):
            _write(dict(chunk), timezone.now())
    channel_hints.dashboard_changed()  # the pages that show them read them again


def _write(changes: dict[UUID, Reason], now: datetime) -> None:
    still_waiting = (
        Request.objects.filter(pk__in=changes, state__in=WAITING_STATES)
        .order_by("pk")
        .select_for_update(no_key=True)
        .values_list("pk", "state", "reason")
    )
    new = {}  # id: (state, reason, traced)
    for rid, state, stored in still_waiting:
        reason = changes[rid]
        kind, text = (stored["kind"], stored["text"]) if stored else (None, None)
        if (kind, text) != (reason.kind, reason.text):
            traced = kind != reason.kind or (kind != BEHIND and said(text) != said(reason.text))
            new[rid] = (state, reason, traced)
    Request.objects.bulk_update(
        [Request(pk=rid, reason=reason.as_json()) for rid, (_, reason, _) in new.items()],
        ["reason"],
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
        for rid, (state, reason, traced) in new.items()
        if traced
    )

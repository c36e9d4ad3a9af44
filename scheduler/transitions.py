"""Every change of a request's state goes through `move`: a compare-and-set on the row in the
same transaction as its Trace row, announced after commit."""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import announce, wakeup
from .models import TERMINAL_STATES, Request, State, Trace

S = State
ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.NEEDS_LOADING, S.READY, S.FAILED, S.CANCELLED, S.EXPIRED},
    S.NEEDS_LOADING: {S.READY, S.PENDING, S.FAILED, S.CANCELLED, S.EXPIRED},
    S.READY: {S.PROCESSING, S.PENDING, S.FAILED, S.CANCELLED, S.EXPIRED},
    # Back to ready: retry after a failure; back to pending: the model went away, or the
    # worker that held it stopped.
    S.PROCESSING: {S.COMPLETED, S.FAILED, S.READY, S.PENDING},
}


# What a terminal move writes that its caller needs for the answer.
OUTCOME_FIELDS = ("result", "error", "error_code")
# A larger answer stays in the row only: hints are meant to be small.
MAX_HINTED_RESULT_BYTES = 256 * 1024


class ImpossibleTransition(ValueError):
    pass


def check(from_states: Iterable[str], to_state: str) -> None:
    """Raise unless every one of `from_states` may move to `to_state`."""
    for source in from_states:
        if to_state not in ALLOWED.get(source, set()):
            raise ImpossibleTransition(f"{source} → {to_state}")


def move(
    request_id,
    from_states: Iterable[str],
    to_state: str,
    reason: str,
    at_server: str = "",
    *,
    held_by: int | None = None,
    **fields,
) -> bool:
    """Move the request if it is still in one of `from_states` (and, with `held_by`, still
    held by that worker). False, writing nothing, if it moved meanwhile."""
    from_states = tuple(from_states)
    check(from_states, to_state)
    if to_state in TERMINAL_STATES:
        fields.setdefault("finished_at", timezone.now())
    # No savepoint when nested: a refused compare-and-set writes nothing to undo.
    with transaction.atomic(savepoint=False):
        rows = Request.objects.filter(pk=request_id, state__in=from_states)
        if held_by is not None:
            rows = rows.filter(worker_id=held_by)
        if len(from_states) == 1:
            # The conditional UPDATE is the compare-and-set, and the source state is known.
            if not rows.update(state=to_state, **fields):
                return False
            source = from_states[0]
        else:
            source = rows.select_for_update().values_list("state", flat=True).first()
            if source is None:
                return False
            Request.objects.filter(pk=request_id).update(state=to_state, **fields)
        Trace.objects.create(
            request_id=request_id,
            # Stamped once the row is ours: a move that waited for the lock comes after
            # the one that held it, in the trace as in fact.
            at=timezone.now(),
            from_state=source,
            to_state=to_state,
            server=at_server or "",
            reason=reason,
        )
        if to_state in (S.CANCELLED, S.PENDING):
            # A cancel frees room; a request back in line needs routing: wake the workers.
            wakeup.notify_in_transaction()
        outcome = outcome_of(to_state, fields)
        transaction.on_commit(lambda: announce.request_moved(request_id, to_state, outcome))
    return True


def outcome_of(to_state: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The part of a terminal move's `fields` that its hint carries."""
    if to_state not in TERMINAL_STATES:
        return None
    outcome = {k: fields[k] for k in OUTCOME_FIELDS if k in fields}
    if "result" in outcome and len(json.dumps(outcome["result"])) > MAX_HINTED_RESULT_BYTES:
        del outcome["result"]
    return outcome


@dataclass(frozen=True)
class Transition:
    """One `move`, as data, so that several can share a transaction."""

    request_id: Any
    from_states: tuple[str, ...]
    to_state: str
    reason: str
    fields: dict[str, Any] = field(default_factory=dict)


def move_all(transitions: list[Transition]) -> list[bool]:
    """Each transition as `move` would make it, all in one transaction (one commit); the
    result of each, in order."""
    with transaction.atomic(savepoint=False):
        return [
            move(t.request_id, t.from_states, t.to_state, t.reason, **t.fields) for t in transitions
        ]

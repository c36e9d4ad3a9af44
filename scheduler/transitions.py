"""Every change of a request's state goes through `move`: a compare-and-set on the row in the
same transaction as its Trace row, announced after commit."""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import channel_hints, sql, wakeup
from .models import TERMINAL_STATES, WAITING_STATES, Request, State, Trace

S = State
ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.NEEDS_LOADING, S.READY, S.FAILED, S.CANCELLED, S.EXPIRED},
    S.NEEDS_LOADING: {S.READY, S.PENDING, S.FAILED, S.CANCELLED, S.EXPIRED},
    S.READY: {S.PROCESSING, S.PENDING, S.FAILED, S.CANCELLED, S.EXPIRED},
    # Back to ready: retry after a failure; back to pending: the model went away, or the
    # worker that held it stopped. Cancelled: its call is stopped (`store.cancel_request`).
    S.PROCESSING: {S.COMPLETED, S.FAILED, S.READY, S.PENDING, S.CANCELLED},
}


# What a terminal move writes that its caller needs for the answer.
OUTCOME_FIELDS = ("result", "error", "error_code")
# A larger answer stays in the row only: hints are meant to be small.
MAX_HINTED_RESULT_BYTES = 256 * 1024
MAX_NOTIFY_PAYLOAD = 8000  # PostgreSQL's limit, in bytes (a JSON dump is ASCII)


class ImpossibleTransition(ValueError):
    pass


def check(from_states: Iterable[str], to_state: str) -> None:
    """Raise unless every one of `from_states` may move to `to_state`."""
    for source in from_states:
        if to_state not in ALLOWED.get(source, set()):
            raise ImpossibleTransition(f"{source} → {to_state}")


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
    """One move, as data, so that several can share a transaction (and a statement)."""

    request_id: Any
    from_states: tuple[str, ...]
    to_state: str
    reason: str
    fields: dict[str, Any] = field(default_factory=dict)
    at_server: str = ""
    held_by: int | None = None  # move only while this worker holds the request
    # A move made first, by the same UPDATE (a request routed and sent at once): the row
    # goes from its states to this one's, each step with its own trace row.
    via: "Transition | None" = None

    def steps(self) -> list["Transition"]:
        if self.via is None:
            return [self]
        return [self.via, replace(self, from_states=(self.via.to_state,), via=None)]


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
    transition = Transition(
        request_id, tuple(from_states), to_state, reason, fields, at_server, held_by
    )
    return move_all([transition])[0]


Locked = dict[Any, tuple[str, int | None]]  # a row's key → its state and worker


def move_all(transitions: list[Transition], locked: Locked | None = None) -> list[bool]:
    """Each transition as `move` makes it, all in one transaction; the result of each, in
    order. The rows are claimed in one statement, rows that move alike are updated in one,
    and the trace rows are inserted in one: a pass that sends thirty requests does not
    write ninety statements.

    `locked`: the rows as the caller read them under lock in this transaction (each request
    named once). Then each move is known at once, and its UPDATE goes with the
    transaction's last writes, as its trace rows do."""
    for step in (step for t in transitions for step in t.steps()):
        check(step.from_states, step.to_state)
    if locked is not None and len({t.request_id for t in transitions}) < len(transitions):
        raise ValueError("with `locked`, each request moves once")
    results: list[bool] = []
    # No savepoint when nested: a refused compare-and-set writes nothing to undo. The trace
    # rows go with the transaction's last writes: nothing reads them before its commit.
    with sql.atomic(savepoint=False):
        for chunk in _distinct_requests(transitions):
            results += _move_chunk(chunk, locked)
    return results


def _distinct_requests(transitions: list[Transition]) -> Iterator[list[Transition]]:
    """Runs of transitions that name each request once: a second move of the same request
    must see the first."""
    chunk: list[Transition] = []
    named: set = set()
    for t in transitions:
        if t.request_id in named:
            yield chunk
            chunk, named = [], set()
        chunk.append(t)
        named.add(t.request_id)
    if chunk:
        yield chunk


def _move_chunk(transitions: list[Transition], locked: Locked | None) -> list[bool]:
    now = timezone.now()
    writes = [_fields_written(t, now) for t in transitions]
    if locked is None and len(transitions) == 1 and len(transitions[0].from_states) == 1:
        sources = [_compare_and_set(transitions[0], writes[0])]
    else:
        keys = sql.keys(Request, [t.request_id for t in transitions])
        sources = _sources(transitions, keys, _lock(keys) if locked is None else locked)
        _update_alike(
            (
                (t.to_state, fields, t.request_id)
                for t, fields, source in zip(transitions, writes, sources, strict=True)
                if source
            ),
            later=locked is not None,
        )
    moved = [
        (t, fields, source)
        for t, fields, source in zip(transitions, writes, sources, strict=True)
        if source
    ]
    # Stamped once the rows are ours: a move that waited for the lock comes after the one
    # that held it, in the trace as in fact.
    _trace([(t, source) for t, _, source in moved], timezone.now())
    if any(t.to_state in (S.CANCELLED, S.PENDING) for t, _, _ in moved):
        # A cancel frees room; a request back in line needs routing: wake the workers.
        wakeup.notify_in_transaction()
    for t, fields, _ in moved:
        outcome = outcome_of(t.to_state, fields)
        transaction.on_commit(
            lambda t=t, outcome=outcome: channel_hints.request_moved(
                t.request_id, t.to_state, outcome
            )
        )
    return [source is not None for source in sources]


def _fields_written(t: Transition, now) -> dict[str, Any]:
    fields = t.fields
    if t.to_state not in WAITING_STATES:  # why it waited no longer holds
        fields = {**fields, "reason": None}
    if t.to_state in TERMINAL_STATES and "finished_at" not in fields:
        fields = {**fields, "finished_at": now}
    return fields


REQUESTS = Request._meta.db_table
TRACES = Trace._meta.db_table
MOVES_PER_TRACE_INSERT = 250  # up to two rows a move, six values a row: within SQLite's limit


def _compare_and_set(t: Transition, fields: dict[str, Any]) -> str | None:
    """One request from one known state: the conditional UPDATE is the compare-and-set."""
    changed = sql.execute(*_set_if_unmoved(t, fields))
    return t.from_states[0] if changed else None


def _set_if_unmoved(t: Transition, fields: dict[str, Any]) -> sql.Statement:
    """The UPDATE that moves one request if it is still in its one known state (and, with
    `held_by`, still held by that worker). It finds the row by its key alone (`IS NOT
    DISTINCT FROM` uses no index): prepared, a plan made while the table was small must not
    read the requests through another index (the index of workers: every row a worker ever
    held)."""
    changes, params = sql.assignments(Request, {"state": t.to_state, **fields})
    columns, values = ["state"], [t.from_states[0]]
    if t.held_by is not None:
        columns.append("worker_id")
        values.append(t.held_by)
    statement = (
        f"UPDATE {REQUESTS} SET {changes} WHERE id = %s"
        f" AND ({', '.join(columns)}) IS NOT DISTINCT FROM ({sql.marks(len(values))})"
    )
    return sql.prepared(statement), [*params, *sql.keys(Request, [t.request_id]), *values]


def locking(columns: str, keys: list[Any]) -> sql.Statement:
    """The read of `columns` of the requests of these keys that locks their rows."""
    # In key order: two workers locking overlapping batches never wait on each other crosswise.
    order = " ORDER BY id" if len(keys) > 1 else ""
    return _of_keys(f"SELECT {columns} FROM {REQUESTS}", len(keys), order + sql.for_update()), keys


def _of_keys(statement: str, count: int, then: str = "") -> str:
    """`statement` on the requests of `count` keys (`then`: what follows its WHERE). Of
    one, the shape that recurs, it is prepared (planned once per connection); a batch's IN
    list has a new length each time."""
    if count == 1:
        return sql.prepared(f"{statement} WHERE id = %s{then}")
    return f"{statement} WHERE id IN ({sql.marks(count)}){then}"


def _lock(keys: list[Any]) -> Locked:
    """Lock the rows of these keys in one statement."""
    rows = sql.fetch(*locking("id, state, worker_id", keys))
    return {key: (state, worker) for key, state, worker in rows}


def _sources(transitions: list[Transition], keys: list[Any], found: Locked) -> list[str | None]:
    """The state each request (of these keys) moves from, or None where it moved meanwhile
    (or its worker no longer holds it)."""
    sources = []
    for t, key in zip(transitions, keys, strict=True):
        state, worker = found.get(key, (None, None))
        held = t.held_by is None or worker == t.held_by
        sources.append(state if state in t.from_states and held else None)
    return sources


def _update_alike(moves: Iterable[tuple[str, dict[str, Any], Any]], later: bool) -> None:
    """One UPDATE per set of locked rows that take the same values (`later`: with the
    transaction's last writes)."""
    groups: list[tuple[str, dict[str, Any], list[Any]]] = []
    for to_state, fields, request_id in moves:
        alike = next((g for g in groups if g[0] == to_state and g[1] == fields), None)
        if alike is None:
            groups.append((to_state, fields, [request_id]))
        else:
            alike[2].append(request_id)
    write = sql.write_later if later else sql.execute
    for to_state, fields, request_ids in groups:
        changes, params = sql.assignments(Request, {"state": to_state, **fields})
        ids = sql.keys(Request, request_ids)
        write(_of_keys(f"UPDATE {REQUESTS} SET {changes}", len(ids)), params + ids)


TRACE_INSERT = f"INSERT INTO {TRACES} (request_id, at, from_state, to_state, server, reason)"


def _trace_rows(t: Transition, key: Any, stamp: Any, source: str) -> list[list[Any]]:
    """The values of a move's trace rows: one per step."""
    rows = []
    for step in t.steps():
        rows.append([key, stamp, source, step.to_state, step.at_server, step.reason])
        source = step.to_state
    return rows


def _trace(moved: list[tuple[Transition, str]], at) -> None:
    """The trace rows of the moves made, in as few INSERTs as the database takes."""
    stamp = sql.db_value(Trace, "at", at)
    for chunk in sql.chunks(moved, MOVES_PER_TRACE_INSERT):
        keys = sql.keys(Request, [t.request_id for t, _ in chunk])
        rows = [
            row
            for (t, source), key in zip(chunk, keys, strict=True)
            for row in _trace_rows(t, key, stamp, source)
        ]
        values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
        sql.write_later(
            sql.prepared(f"{TRACE_INSERT} VALUES {values}"), [p for row in rows for p in row]
        )


@dataclass(frozen=True)
class LaterEnd:
    """A held request's end, written with its transaction's last writes (`end_later`)."""

    condition: sql.Statement  # true in SQL once the end is made: for writes that go with it
    traced: sql.Written

    @property
    def made(self) -> bool:
        """Whether the request ended; known once the transaction's writes are sent."""
        return bool(self.traced.rows)


def end_later(t: Transition, notify_origin: bool = False) -> LaterEnd:
    """End a request that its worker holds (`held_by`) with no round trip of its own: its
    compare-and-set, its trace row and the caller's writes made on its `condition` go with
    the transaction's last writes (on PostgreSQL, with its COMMIT). The condition is the row
    in its end state, held by that worker, with this end's own `finished_at` stamp: no
    other move writes that.

    `notify_origin` (PostgreSQL): the end's hint goes to the web process that made the
    request's id by a NOTIFY in the same transaction too, delivered by the commit itself,
    before this worker has even heard that it went through and sent the channel layer's
    hint (which still goes, for dashboards and callers elsewhere). Not for a streamed
    request: its end must come after its chunks, which travel by the channel layer."""
    if t.held_by is None or t.to_state not in TERMINAL_STATES or len(t.from_states) != 1:
        raise ValueError("end_later ends a held request from one state")
    check(t.from_states, t.to_state)
    now = timezone.now()
    fields = _fields_written(t, now)
    sql.write_later(*_set_if_unmoved(t, fields))
    # Found by its key alone too, as in `_set_if_unmoved`.
    [key] = sql.keys(Request, [t.request_id])
    condition = (
        f"EXISTS (SELECT 1 FROM {REQUESTS} WHERE id = %s"
        " AND (state, worker_id, finished_at) IS NOT DISTINCT FROM (%s, %s, %s))",
        [key, t.to_state, t.held_by, sql.db_value(Request, "finished_at", fields["finished_at"])],
    )
    [row] = _trace_rows(t, key, sql.db_value(Trace, "at", now), t.from_states[0])
    traced = sql.write_later(
        sql.prepared(
            f"{TRACE_INSERT} SELECT %s, %s, %s, %s, %s, %s WHERE {condition[0]}"
            " RETURNING request_id"
        ),
        [*row, *condition[1]],
    )
    end = LaterEnd(condition, traced)
    outcome = outcome_of(t.to_state, fields)
    if notify_origin and settings.IS_POSTGRES:  # else no NOTIFY goes: no payload to dump
        channel = wakeup.origin_channel(t.request_id)
        wakeup.notify_later(channel, _end_payload(t, outcome), only_if=condition)
    transaction.on_commit(
        lambda: end.made and channel_hints.request_moved(t.request_id, t.to_state, outcome)
    )
    return end


def _end_payload(t: Transition, outcome: dict[str, Any] | None) -> str:
    """The end's hint as a NOTIFY payload; without its outcome if that would not fit (the
    caller then reads the row)."""
    payload = json.dumps(channel_hints.end_message(t.request_id, t.to_state, outcome))
    if len(payload) < MAX_NOTIFY_PAYLOAD:
        return payload
    return json.dumps(channel_hints.end_message(t.request_id, t.to_state))

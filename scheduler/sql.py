"""The hot path's statements as SQL written once, for PostgreSQL and SQLite alike.

The ORM compiles every statement anew on each call: an `UPDATE … WHERE id = … AND state = …`
costs 0.5 ms of CPU through it and 0.2 ms as SQL, and a request makes about a dozen of them.
Values still go through their model fields (`get_db_prep_save`), so a UUID, a timestamp or a
JSON value is written exactly as the ORM writes it.
"""

import functools
import hashlib
import itertools
import re
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.db import connection, models, transaction
from psycopg.pq import ExecStatus

T = TypeVar("T")
Statement = tuple[str, Sequence[Any]]


class Increment(NamedTuple):
    """A value that adds to the column's own: `attempts = attempts + 1`."""

    by: int = 1


class Prepared(str):
    """A statement PostgreSQL parses and plans once per connection (`PREPARE`), then runs by
    name with each call's values (`EXECUTE`, still one simple-protocol query that joins
    others). Planning was most of the hot statements' server time: the snapshot's reads of
    servers and deployments cost the server 0.20 ms of CPU as text, 0.06 ms prepared.

    Make one with `prepared(text)`, for a statement whose best plan stays the same as its
    tables grow: an INSERT, a read or write of the small tables (servers, deployments,
    models), or one that finds a request by its key alone (any other condition written so
    that no index serves it). After five calls PostgreSQL keeps one plan for every call,
    made with the table sizes of then: a statement on the requests table, prepared while it
    was nearly empty, would scan it whole forever after, or read it through another index
    (`id = $1 AND worker_id = $2` went through the index of workers: every row the worker
    ever held). Elsewhere (SQLite, or with `DATABASE_PREPARED_STATEMENTS` off) the text runs
    as is."""

    name: str
    numbered: str  # the text with $1, $2, … for its values, as PREPARE takes it

    def execute_text(self, values: int) -> str:
        return f"EXECUTE {self.name}({marks(values)})" if values else f"EXECUTE {self.name}"


@functools.lru_cache(maxsize=1024)
def prepared(text: str) -> Prepared:
    """`text` as a Prepared statement (made once per text: some are built per call)."""
    statement = Prepared(text)
    statement.name = "sy_" + hashlib.blake2s(text.encode(), digest_size=8).hexdigest()
    numbers = itertools.count(1)
    statement.numbered = re.sub(
        r"%[s%]", lambda m: f"${next(numbers)}" if m[0] == "%s" else "%", text
    )
    return statement


MAX_PREPARED = 500  # a connection's; beyond, a statement of a rarer shape runs as text


def _by_name(statements: Sequence[Statement]) -> Sequence[Statement]:
    """On PostgreSQL, each Prepared statement as an EXECUTE of its name, first preparing on
    this connection those it has not seen (one round trip, once per connection: prepared
    statements outlive a rollback, and psycopg's pool keeps them with the connection)."""
    if not settings.PREPARED_STATEMENTS or not any(isinstance(s, Prepared) for s, _ in statements):
        return statements
    connection.ensure_connection()
    raw = connection.connection
    known: set[str] | None = getattr(raw, "switchyard_prepared", None)
    if known is None:
        known = raw.switchyard_prepared = set()
    new = {s.name: s for s, _ in statements if isinstance(s, Prepared) and s.name not in known}
    if new and len(known) + len(new) <= MAX_PREPARED:
        # Set-up of the connection, like Django's own (its time zone): on the driver's
        # connection, in or out of a transaction, and in no count of the queries made.
        with connection.wrap_database_errors:
            raw.execute("; ".join(f"PREPARE {n} AS {s.numbered}" for n, s in new.items()))
        known.update(new)
    return [
        (s.execute_text(len(p)) if isinstance(s, Prepared) and s.name in known else s, p)
        for s, p in statements
    ]


def execute(statement: str, params: Sequence[Any] = ()) -> int:
    """Run one statement; the number of rows it changed."""
    [(statement, params)] = _by_name([(statement, params)])
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


class Written:
    """A `write_later` statement's outcome: the rows it returned (`RETURNING`), once sent."""

    rows: list[tuple] | None = None


def _run_each(statements: Sequence[Statement], written: Sequence[Written]) -> None:
    """Run the statements in one query (several only on PostgreSQL), each one's returned
    rows to its Written."""
    with connection.cursor() as cursor:
        cursor.execute(*_joined(_by_name(statements)))
        for i, outcome in enumerate(written):
            if i:
                cursor.nextset()
            outcome.rows = cursor.fetchall() if _returned_rows(cursor.cursor) else []


def _returned_rows(cursor: Any) -> bool:
    """Whether the cursor's current result has rows (a SELECT, a RETURNING). On psycopg by
    the result's status, not by `description`: that builds an object per column at each
    call, a third of a snapshot read's CPU."""
    result = getattr(cursor, "pgresult", None)
    if result is None:
        return cursor.description is not None
    return result.status == ExecStatus.TUPLES_OK


def fetch_all(statements: Sequence[Statement]) -> list[list[tuple]]:
    """The rows of each query, in order. On PostgreSQL in one round trip: one query of
    several statements, its values bound on the client as Django binds them all (psycopg's
    client-side cursor, simple query protocol), run in order (so row locks are taken in
    order). On SQLite, in turn: there is no round trip to save."""
    if not settings.IS_POSTGRES or len(statements) == 1:
        return [fetch(statement, params) for statement, params in statements]
    read = [Written() for _ in statements]
    _run_each(statements, read)
    return [outcome.rows or [] for outcome in read]


def _joined(statements: Sequence[Statement]) -> tuple[str, list[Any]]:
    return "; ".join(s for s, _ in statements), [p for _, params in statements for p in params]


_held = threading.local()  # the writes of this thread's open `writes_at_end`


@contextmanager
def writes_at_end(commit: bool = False) -> Iterator[None]:
    """Inside a transaction: hold the `write_later` statements made within, and send them
    together when it ends without error, just before the commit (one round trip on
    PostgreSQL). Nested, the outermost sends. With `commit`, in Django's outermost atomic
    block, on PostgreSQL: the COMMIT goes in the same round trip (Django's own then finds
    the transaction ended, and sends nothing); nothing may run between this block's end and
    the atomic block's."""
    if getattr(_held, "writes", None) is not None:
        yield
        return
    _held.writes = []
    try:
        yield
        writes = _held.writes
    finally:
        _held.writes = None
    if writes and settings.IS_POSTGRES and commit and _outermost_block():
        writes.append(("COMMIT", [], Written()))
    _send(writes)


def send_held_writes() -> None:
    """Inside `writes_at_end`: send the writes held so far now, for what follows to read
    what they wrote."""
    writes = getattr(_held, "writes", None)
    if writes:
        _held.writes = []
        _send(writes)


def _send(writes: list[tuple[str, Sequence[Any], Written]]) -> None:
    if writes and settings.IS_POSTGRES:
        _run_each([(s, p) for s, p, _ in writes], [w for _, _, w in writes])
    else:
        for statement, params, written in writes:
            _run_each([(statement, params)], [written])


def _outermost_block() -> bool:
    """In Django's only atomic block, which will commit (not inside a test's, say)."""
    return len(connection.atomic_blocks) == 1 and not connection.needs_rollback


@contextmanager
def atomic(savepoint: bool = True) -> Iterator[None]:
    """A transaction whose `write_later` writes go at its end, with its COMMIT on
    PostgreSQL: with the BEGIN that rides on its first statement (config/postgresql), a
    transaction of writes alone is one round trip."""
    with transaction.atomic(savepoint=savepoint), writes_at_end(commit=True):
        yield


def write_later(statement: str, params: Sequence[Any] = ()) -> Written:
    """A write that nothing in its transaction reads back (a trace row, a counter, a
    setting, a NOTIFY, an insert): sent with the others when the open `writes_at_end` ends;
    at once outside one. What it returns (`RETURNING`) is in the Written by then."""
    written = Written()
    writes = getattr(_held, "writes", None)
    if writes is None:
        _run_each([(statement, params)], [written])
    else:
        writes.append((statement, params, written))
    return written


def without_waiting_for_disk() -> None:
    """Inside a transaction whose loss the system repairs by itself: commit it without
    waiting for its WAL to reach the disk (PostgreSQL's `synchronous_commit` off), but only
    with `SWITCHYARD_SKIP_FLUSH` on. Off (the default), every commit waits for the disk.

    A flush costs 0.1 ms on a quiet disk, 3 ms while another process writes. A killed
    Switchyard process loses nothing either way: the commit is already in the database
    server's memory, which writes it out within a fraction of a second; only a crash of the
    database server in that fraction can lose it, leaving the rows as they were before. A
    later durable commit flushes it too, so a durable state never rests on a lost move.
    What each such commit risks: docs/operating.md, "Durability"."""
    if settings.IS_POSTGRES and settings.SWITCHYARD.get("SKIP_FLUSH", False):
        write_later("SET LOCAL synchronous_commit TO OFF")


def fetch(statement: str, params: Sequence[Any] = ()) -> list[tuple]:
    [(statement, params)] = _by_name([(statement, params)])
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in runs of at most `size`: one statement each, within the parameters a
    database takes in one statement."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def marks(n: int) -> str:
    """`%s, %s, …`: the placeholders of an IN list of `n` values."""
    return ", ".join(["%s"] * n)


def for_update(of: str = "") -> str:
    """Lock the rows read (PostgreSQL); SQLite writes one transaction at a time anyway.

    `NO KEY UPDATE`, the lock an UPDATE of other columns than the key takes: it leaves
    alone the checks of foreign keys that point at the row (a request's at its deployment
    and server, a trace row's at its request), which PostgreSQL makes at commit with a `KEY
    SHARE` lock. A `FOR UPDATE` would make such a check wait at the end of a transaction
    that locked requests, behind one that locked the deployment first: a deadlock, against
    the lock order (docs/architecture.md)."""
    if not connection.features.has_select_for_update:
        return ""
    return f" FOR NO KEY UPDATE OF {of}" if of else " FOR NO KEY UPDATE"


FoundBy = tuple[str, str, Any, tuple[str, Sequence[Any]]]


def insert(instance: models.Model, found_by: FoundBy | None = None) -> Written:
    """INSERT the unsaved `instance` (its key set in Python), every concrete field as the
    ORM would write it; with `write_later`, so nothing in its transaction may read it.

    `found_by` = (foreign key, column, value, (other column, allowed values)): the key is
    looked up in the same statement, as the id of the row of its model whose `column` is
    `value` and whose other column holds one of the allowed values. Then the Written's rows
    are that id, or none (and nothing inserted) if no row matches."""
    meta = instance._meta
    fields = meta.concrete_fields
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    columns = f"INSERT INTO {meta.db_table} ({', '.join(f.column for f in fields)})"
    if found_by is None:
        statement = f"{columns} VALUES ({marks(len(fields))})"
    else:
        name, column, value, (other, allowed) = found_by
        key = meta.get_field(name)
        related = key.related_model._meta
        values = [f"k.{f.target_field.column}" if f is key else "%s" for f in fields]
        params = [p for f, p in zip(fields, params, strict=True) if f is not key]
        params += [value, *allowed]
        statement = (
            f"{columns} SELECT {', '.join(values)} FROM {related.db_table} k"
            f" WHERE k.{related.get_field(column).column} = %s"
            f" AND k.{related.get_field(other).column} IN ({marks(len(allowed))})"
            f" RETURNING {key.column}"
        )
    written = write_later(prepared(statement), params)
    instance._state.adding = False
    instance._state.db = connection.alias
    return written


def db_value(model: type[models.Model], name: str, value: Any) -> Any:
    """`value` as the ORM would write it to the field `name` (attname or name)."""
    return model._meta.get_field(name).get_db_prep_save(value, connection)


def keys(model: type[models.Model], values: Iterable[Any]) -> list[Any]:
    """Primary keys as the database takes them (a UUID is text on SQLite)."""
    pk = model._meta.pk
    return [pk.get_db_prep_value(v, connection) for v in values]


def assignments(model: type[models.Model], fields: dict[str, Any]) -> tuple[str, list[Any]]:
    """The SET list for `fields` and its parameters."""
    parts, params = [], []
    for name, value in fields.items():
        column = model._meta.get_field(name).column
        if isinstance(value, Increment):
            parts.append(f"{column} = {column} + %s")
            params.append(value.by)
        else:
            parts.append(f"{column} = %s")
            params.append(db_value(model, name, value))
    return ", ".join(parts), params


def aware(value: Any) -> Any:
    """A value read back as the ORM reads it: SQLite gives timestamps without their zone
    (stored in UTC); anything else passes unchanged."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def uuid_of(value: Any) -> uuid.UUID:
    """A UUID key read back (SQLite keeps it as hex text)."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


def timestamp(text: str | None) -> datetime | None:
    """A timestamp read as text (`CAST(… AS TEXT)`), with its zone (UTC on SQLite)."""
    return None if text is None else aware(datetime.fromisoformat(text))

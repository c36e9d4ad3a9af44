"""What PostgreSQL read from the requests table, by its own statistics: a read's cost as
the table grows, without timing it."""

from collections.abc import Callable
from typing import TypeVar

import pytest
from django.db import connection, transaction

from scheduler.models import Request
from tests.support.polling import eventually

REQUESTS = Request._meta.db_table
T = TypeVar("T")


def other_sessions() -> list[tuple]:
    """Other sessions at work on this database (idle ones hold no snapshot): an open
    snapshot of theirs keeps PostgreSQL from marking dead index entries as such."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, left(query, 80) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
            " AND (state <> 'idle' OR backend_xmin IS NOT NULL)"
        )
        return cursor.fetchall()


@pytest.fixture
def unvacuumed():
    """The requests table as autovacuum may leave it for a while (or for good, if off):
    the index entries of rows that changed stay until a vacuum. Alone on the database: an
    earlier test's processes may still be closing their connections on a loaded machine."""
    try:
        eventually(lambda: not other_sessions(), timeout=60)
    except AssertionError as gone_too_slowly:
        raise AssertionError(f"still connected: {other_sessions()}") from gone_too_slowly
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {REQUESTS} SET (autovacuum_enabled = off)")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {REQUESTS} RESET (autovacuum_enabled)")


def entries_read_by(read: Callable[[], T]) -> tuple[T, int]:
    """`read()`'s result, and the index entries and table rows it read from the requests
    table: run in a transaction of its own and counted by PostgreSQL for that transaction,
    so no other session's reads count (another test's process still at work)."""
    with transaction.atomic():
        before = _read_in_transaction()
        result = read()
        return result, _read_in_transaction() - before


def _read_in_transaction() -> int:
    with connection.cursor() as cursor:
        # Of the table, the rows its sequential scans read; of an index, the entries its
        # scans returned (pg_stat_xact_user_tables' seq_tup_read, and pg_stat_user_indexes'
        # idx_tup_read, which has no view of its own for the transaction).
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_returned(%s::regclass) + coalesce(sum("
            "pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index"
            " WHERE indrelid = %s::regclass",
            [REQUESTS, REQUESTS],
        )
        return int(cursor.fetchone()[0])

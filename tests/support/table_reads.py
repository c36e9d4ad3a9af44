"""What PostgreSQL read from the requests table, by its own statistics: a read's cost as
the table grows, without timing it."""

import pytest
from django.db import connection

from scheduler.models import Request
from tests.support.polling import eventually

REQUESTS = Request._meta.db_table


def other_sessions() -> list[tuple]:
    """Other sessions at work on this database (idle ones read nothing and hold no
    snapshot): their reads count in entries_read(), and an open snapshot of theirs keeps
    PostgreSQL from marking dead index entries as such."""
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


def entries_read() -> int:
    """Index entries and table rows read from the requests table so far (every session's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # done before the next query
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = %s)"
            " + (SELECT seq_tup_read FROM pg_stat_user_tables WHERE relname = %s)",
            [REQUESTS, REQUESTS],
        )
        return int(cursor.fetchone()[0])

"""What PostgreSQL read from the requests table, by its own statistics: a read's cost as
the table grows, without timing it."""

import pytest
from django.db import connection

from scheduler.models import Request

REQUESTS = Request._meta.db_table


@pytest.fixture
def unvacuumed():
    """The requests table as autovacuum may leave it for a while (or for good, if off):
    the index entries of rows that changed stay until a vacuum."""
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

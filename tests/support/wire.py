"""What the test's database connection sends to PostgreSQL, as libpq traces it."""

import tempfile
from collections.abc import Callable

from django.db import connection


def queries_sent(work: Callable[[], object]) -> list[str]:
    """The queries `work` sent, one per round trip (the simple query protocol)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            work()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return [
            line.split("\tQuery\t", 1)[1].strip().strip('"')
            for line in trace
            if "\tF\t" in line and "\tQuery\t" in line
        ]

"""Django's PostgreSQL backend, less a round trip per transaction.

psycopg opens a transaction with a `BEGIN` of its own, a round trip before the first
statement, and Django ends it with a `COMMIT`, another. On a request's path every round trip
costs a tenth of a millisecond or more (two processes woken, twice), and a request makes
three transactions. Here the connection stays in psycopg's autocommit mode while Django
thinks it is not, and the `BEGIN` Django owes goes in front of the transaction's first
statement, as one query. (`sql.atomic` sends the `COMMIT` with its last writes as well.)

Everything else is Django's: atomic blocks, savepoints, on-commit hooks, the pool.
"""

from typing import Any

from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus

BEGIN = "BEGIN"


def begin_owed(owner: "DatabaseWrapper | None", connection: Any) -> bool:
    """Django opened a transaction (`autocommit` off) that has not begun on the server."""
    return (
        owner is not None
        and not owner.autocommit
        and connection.info.transaction_status == TransactionStatus.IDLE
    )


class Cursor(base.Cursor):
    """Client-side binding (Django's default): a query goes as one simple-protocol
    message, so `BEGIN; <statement>` costs one round trip."""

    owner: "DatabaseWrapper | None" = None

    def execute(self, query, params=None, **kwargs):
        if not begin_owed(self.owner, self.connection):
            return super().execute(query, params, **kwargs)
        if not isinstance(query, str):  # a composed query: BEGIN on its own
            super().execute(BEGIN)
            return super().execute(query, params, **kwargs)
        super().execute(f"{BEGIN}; {query}", params, **kwargs)
        self.nextset()  # past BEGIN's own result, to the statement's
        return self

    def executemany(self, query, params_seq, **kwargs):
        if begin_owed(self.owner, self.connection):
            super().execute(BEGIN)
        return super().executemany(query, params_seq, **kwargs)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        params["cursor_factory"] = Cursor
        return params

    def _set_autocommit(self, autocommit: bool) -> None:
        # psycopg would send a BEGIN of its own before the first statement unless in
        # autocommit; Django's own flag (`self.autocommit`) says whether a BEGIN is owed.
        with self.wrap_database_errors:
            if not self.connection.autocommit:
                self.connection.autocommit = True

    def create_cursor(self, name: str | None = None):
        if name and begin_owed(self, self.connection):
            # A named cursor declares itself at once: the transaction must be open first.
            with self.connection.cursor() as cursor:
                cursor.execute(BEGIN)
        cursor = super().create_cursor(name)
        if isinstance(cursor, Cursor):
            cursor.owner = self
        return cursor

"""Prepared statements: the hot path's statements are planned once per connection and run
by name; they give what their text gives, survive a rollback, and never grow without bound."""

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from scheduler import sql
from tests import factories
from tests.support.wire import queries_sent

pytestmark = pytest.mark.django_db
POSTGRES = settings.IS_POSTGRES
only_postgres = pytest.mark.skipif(not POSTGRES, reason="PREPARE is PostgreSQL's")


def names_prepared() -> set[str]:
    return {name for (name,) in sql.fetch("SELECT name FROM pg_prepared_statements")}


def test_a_prepared_statement_gives_what_its_text_gives():
    factories.server("s1", slots=3)
    factories.server("s2", slots=5)
    text = "SELECT name, slots FROM backends_server WHERE slots > %s AND name LIKE 's%%'"
    statement = sql.prepared(text)

    assert sql.fetch(statement, [4]) == sql.fetch(text, [4]) == [("s2", 5)]
    assert sql.fetch_all([(statement, [2]), (text, [4])]) == [
        [("s1", 3), ("s2", 5)],
        [("s2", 5)],
    ]
    assert sql.prepared(text) is statement  # made once per text


@only_postgres
def test_it_is_prepared_once_per_connection_and_then_sent_by_name():
    statement = sql.prepared("SELECT count(*) FROM backends_server WHERE slots >= %s")
    sql.fetch(statement, [1])
    assert statement.name in names_prepared()

    sent = queries_sent(lambda: sql.fetch(statement, [2]))

    assert sent == [f"EXECUTE {statement.name}(2)"]


@only_postgres
def test_it_outlives_a_rollback():
    server = factories.server("s1")
    rename = sql.prepared("UPDATE backends_server SET name = %s WHERE id = %s")
    with pytest.raises(RuntimeError), transaction.atomic():
        sql.execute(rename, ["s2", server.pk])  # prepared inside the transaction
        raise RuntimeError("rolled back")

    assert sql.execute(rename, ["s3", server.pk]) == 1
    server.refresh_from_db()
    assert server.name == "s3"


@only_postgres
def test_past_the_cap_a_statement_runs_as_its_text(monkeypatch):
    sql.fetch(sql.prepared("SELECT 1"))
    monkeypatch.setattr(sql, "MAX_PREPARED", len(connection.connection.switchyard_prepared))
    rare = sql.prepared("SELECT 2 WHERE %s")

    sent = queries_sent(lambda: sql.fetch(rare, [True]))

    assert sql.fetch(rare, [True]) == [(2,)]
    assert sent == ["SELECT 2 WHERE true"]
    assert rare.name not in names_prepared()


@only_postgres
@override_settings(PREPARED_STATEMENTS=False)
def test_turned_off_every_statement_runs_as_its_text():
    sent = queries_sent(lambda: sql.fetch(sql.prepared("SELECT 3 WHERE %s"), [True]))

    assert [query.removeprefix("BEGIN; ") for query in sent] == ["SELECT 3 WHERE true"]

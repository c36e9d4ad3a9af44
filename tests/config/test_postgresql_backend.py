"""The PostgreSQL backend sends a transaction's BEGIN with its first statement, and
`sql.atomic` its COMMIT with its last writes: fewer round trips, the same transactions.
Counted on the wire, as libpq traces what the connection sends."""

import pytest
from django.conf import settings
from django.db import IntegrityError, transaction

from access.models import Team  # a table no signal writes to as well
from scheduler import sql
from tests.support.wire import queries_sent as sent

pytestmark = [
    pytest.mark.skipif(not settings.IS_POSTGRES, reason="PostgreSQL's own protocol"),
    pytest.mark.django_db(transaction=True),
]
RENAME = "UPDATE access_team SET name = %s WHERE id = %s"


def names() -> list[str]:
    return sorted(Team.objects.values_list("name", flat=True))


def test_a_transaction_begins_with_its_first_statement():
    def work() -> None:
        with transaction.atomic():
            Team.objects.create(name="a")
            Team.objects.create(name="b")

    queries = sent(work)
    assert len(queries) == 3
    assert queries[0].startswith("BEGIN; INSERT INTO")
    assert queries[1].startswith("INSERT INTO")
    assert queries[2] == "COMMIT"
    assert names() == ["a", "b"]


def test_a_transaction_that_sends_nothing_costs_nothing():
    def work() -> None:
        with transaction.atomic():
            pass

    assert sent(work) == []


def test_outside_a_transaction_a_statement_goes_alone():
    queries = sent(lambda: Team.objects.create(name="a"))
    assert len(queries) == 1 and queries[0].startswith("INSERT INTO")


def test_a_failed_transaction_rolls_back_everything():
    def work() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            Team.objects.create(name="a")
            raise RuntimeError("undo")

    assert sent(work)[-1] == "ROLLBACK"
    assert names() == []
    Team.objects.create(name="b")  # the connection goes on
    assert names() == ["b"]


def test_a_savepoint_rolls_back_its_part_only():
    with transaction.atomic():
        Team.objects.create(name="kept")
        with pytest.raises(IntegrityError), transaction.atomic():
            Team.objects.create(name="kept")  # unique name
    assert names() == ["kept"]


def test_a_named_cursor_reads_inside_the_transaction():
    """QuerySet.iterator() declares a server-side cursor: it must see the transaction's own
    rows, even as its first statement."""
    Team.objects.create(name="a")
    with transaction.atomic():
        assert [s.name for s in Team.objects.iterator(chunk_size=1)] == ["a"]
        Team.objects.create(name="b")
        assert [s.name for s in Team.objects.order_by("name").iterator(chunk_size=1)] == [
            "a",
            "b",
        ]


def test_held_writes_go_with_the_commit_and_hooks_run_after_it():
    team = Team.objects.create(name="a")
    committed: list[list[str]] = []

    def work() -> None:
        with sql.atomic():
            sql.write_later(RENAME, ["b", team.pk])
            sql.write_later(RENAME, ["c", team.pk])
            transaction.on_commit(lambda: committed.append(names()))

    writes, hook = sent(work)  # the hook's read comes after the one round trip of writes
    assert writes.startswith("BEGIN; UPDATE") and writes.endswith("; COMMIT")
    assert hook.startswith("SELECT")
    assert committed == [["c"]]


def test_a_read_then_held_writes_cost_two_round_trips():
    team = Team.objects.create(name="a")

    def work() -> None:
        with sql.atomic():
            assert sql.fetch("SELECT name FROM access_team")[0][0] == "a"
            sql.write_later(RENAME, ["b", team.pk])

    queries = sent(work)
    assert len(queries) == 2 and queries[0].startswith("BEGIN; SELECT name")
    assert queries[1].endswith("; COMMIT")
    assert names() == ["b"]


def test_a_held_write_that_fails_rolls_back_the_transaction():
    Team.objects.create(name="a")
    team = Team.objects.create(name="b")
    with pytest.raises(IntegrityError), sql.atomic():
        Team.objects.create(name="c")
        sql.write_later(RENAME, ["a", team.pk])  # unique name: the write, not the commit
    assert names() == ["a", "b"]
    Team.objects.create(name="d")  # the connection goes on
    assert names() == ["a", "b", "d"]


def test_inside_an_outer_transaction_the_commit_waits_for_it():
    team = Team.objects.create(name="a")

    def work() -> None:
        with transaction.atomic():
            with sql.atomic():
                sql.write_later(RENAME, ["b", team.pk])
            assert names() == ["b"]  # still the same transaction

    queries = sent(work)
    assert not queries[0].endswith("COMMIT")
    assert queries[-1] == "COMMIT"
    assert names() == ["b"]

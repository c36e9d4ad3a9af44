"""`move`: the allowed-transition table, compare-and-set, and its Trace row."""

import pytest
from django.db import transaction
from django.utils import timezone

from scheduler import sql
from scheduler.models import Request, State, Trace, Worker
from scheduler.transitions import ALLOWED, ImpossibleTransition, Transition, move, move_all
from tests import factories

S = State
TERMINAL = {S.COMPLETED, S.FAILED, S.CANCELLED, S.EXPIRED}


def test_the_table_follows_the_life_of_a_request():
    assert {
        S.PENDING: {S.NEEDS_LOADING, S.READY} | TERMINAL - {S.COMPLETED},
        S.NEEDS_LOADING: {S.READY, S.PENDING} | TERMINAL - {S.COMPLETED},
        S.READY: {S.PROCESSING, S.PENDING} | TERMINAL - {S.COMPLETED},
        S.PROCESSING: {S.COMPLETED, S.FAILED, S.READY, S.PENDING, S.CANCELLED},
    } == ALLOWED
    # Terminal states lead nowhere; only processing completes; nothing expires once the
    # server has it (a cancel stops it there: store.cancel_request).
    assert not TERMINAL & set(ALLOWED)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "source, target",
    [
        (S.COMPLETED, S.PENDING),
        (S.FAILED, S.READY),
        (S.PENDING, S.PROCESSING),
        (S.PENDING, S.COMPLETED),
        (S.PROCESSING, S.EXPIRED),
    ],
)
def test_an_impossible_transition_raises_and_writes_nothing(source, target):
    request = factories.request("m1", state=source)
    with pytest.raises(ImpossibleTransition):
        move(request.pk, [source], target, "should not happen")
    request.refresh_from_db()
    assert request.state == source
    assert not Trace.objects.exists()


@pytest.mark.django_db
def test_a_move_writes_its_trace_and_fields_together():
    request = factories.request("m1")
    assert move(request.pk, [S.PENDING], S.CANCELLED, "the caller went away", "gpu-1")
    request.refresh_from_db()
    assert request.state == S.CANCELLED
    assert request.finished_at is not None  # set for every terminal state
    trace = Trace.objects.get()
    assert (trace.from_state, trace.to_state, trace.reason, trace.server) == (
        S.PENDING,
        S.CANCELLED,
        "the caller went away",
        "gpu-1",
    )


@pytest.mark.django_db
def test_a_move_that_lost_the_race_returns_false_and_writes_no_trace():
    request = factories.request("m1")
    assert move(request.pk, [S.PENDING], S.READY, "routed")
    # A second planner acting on the same stale picture: the row is no longer pending.
    assert not move(request.pk, [S.PENDING], S.EXPIRED, "expired")
    assert not move(request.pk, [S.PENDING, S.NEEDS_LOADING], S.CANCELLED, "cancelled")
    request.refresh_from_db()
    assert request.state == S.READY
    assert list(Trace.objects.values_list("to_state", flat=True)) == [S.READY]


@pytest.mark.django_db
def test_a_move_held_by_another_worker_is_refused():
    """A worker that was taken over must not complete what another worker now runs."""
    mine, theirs = Worker.objects.create(host="a", pid=1), Worker.objects.create(host="b", pid=2)
    request = factories.request("m1", state=S.PROCESSING, worker=theirs)
    assert not move(request.pk, [S.PROCESSING], S.COMPLETED, "late", held_by=mine.pk)
    assert move(request.pk, [S.PROCESSING], S.COMPLETED, "done", held_by=theirs.pk)
    assert list(Trace.objects.values_list("reason", flat=True)) == ["done"]


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_moves_commits_together_and_a_refused_one_writes_nothing(
    django_assert_max_num_queries,
):
    first, gone, *rest = (factories.request("m1") for _ in range(10))
    move(gone.pk, [S.PENDING], S.CANCELLED, "the caller hung up")
    now = timezone.now()
    batch = [
        Transition(r.pk, (S.PENDING,), S.READY, "routed", {"ready_at": now})
        for r in (first, gone, *rest)
    ]

    # However many: BEGIN, one SELECT … FOR NO KEY UPDATE, one UPDATE for the rows that move
    # alike, one INSERT of their trace rows, COMMIT.
    with django_assert_max_num_queries(5):
        assert move_all(batch) == [True, False] + [True] * 8

    for r in (first, *rest):
        r.refresh_from_db()
        assert r.state == S.READY and r.ready_at == now
        assert Trace.objects.get(request=r, to_state=S.READY).reason == "routed"
    gone.refresh_from_db()
    assert gone.state == S.CANCELLED
    assert not Trace.objects.filter(request=gone, to_state=S.READY).exists()


@pytest.mark.django_db
def test_in_a_batch_each_move_writes_its_own_values_and_holder_check():
    mine, theirs = Worker.objects.create(host="a", pid=1), Worker.objects.create(host="b", pid=2)
    a, b, c = (factories.request("m1", state=S.PROCESSING, worker=mine) for _ in range(3))
    stolen = factories.request("m1", state=S.PROCESSING, worker=theirs)
    batch = [
        Transition(r.pk, (S.PROCESSING,), S.COMPLETED, "done", {"result": {"n": i}}, "s1", mine.pk)
        for i, r in enumerate((a, b, stolen, c))
    ]

    assert move_all(batch) == [True, True, False, True]

    results = dict(Request.objects.values_list("pk", "result"))
    assert [results[r.pk] for r in (a, b, c)] == [{"n": 0}, {"n": 1}, {"n": 3}]
    assert results[stolen.pk] is None
    assert Request.objects.get(pk=stolen.pk).state == S.PROCESSING
    assert set(Trace.objects.values_list("request_id", "server")) == {
        (a.pk, "s1"),
        (b.pk, "s1"),
        (c.pk, "s1"),
    }


@pytest.mark.django_db
def test_a_batch_that_names_a_request_twice_applies_the_moves_in_order():
    r = factories.request("m1")
    batch = [
        Transition(r.pk, (S.PENDING,), S.NEEDS_LOADING, "routed"),
        Transition(r.pk, (S.PENDING,), S.READY, "routed again"),
        Transition(r.pk, (S.NEEDS_LOADING,), S.READY, "its model is loaded"),
    ]

    assert move_all(batch) == [True, False, True]

    r.refresh_from_db()
    assert r.state == S.READY
    assert list(r.traces.values_list("from_state", "to_state")) == [
        (S.PENDING, S.NEEDS_LOADING),
        (S.NEEDS_LOADING, S.READY),
    ]


@pytest.mark.django_db
def test_a_move_made_via_another_checks_each_step():
    request = factories.request("m1")
    first = Transition(request.pk, (S.PENDING,), S.READY, "routed")
    # pending → ready → completed: the second step is not allowed
    through = Transition(request.pk, (S.PENDING,), S.COMPLETED, "done", via=first)
    with pytest.raises(ImpossibleTransition):
        move_all([through])
    request.refresh_from_db()
    assert request.state == S.PENDING and not Trace.objects.exists()


@pytest.mark.django_db
def test_moves_of_rows_the_caller_locked_follow_what_it_read_and_go_at_the_end():
    """`locked`: the caller read the rows under lock; a move from another state than the one
    read is refused, and the UPDATEs wait for the transaction's end with its trace rows."""
    mine = Worker.objects.create(host="a", pid=1)
    ready, moved = factories.request("m1", state=S.READY), factories.request("m1", state=S.READY)
    locked = {
        key: (state, None)
        for key, state in zip(
            sql.keys(Request, [ready.pk, moved.pk]), [S.READY, S.PENDING], strict=True
        )
    }
    batch = [
        Transition(r.pk, (S.READY,), S.PROCESSING, "sent", {"worker_id": mine.pk})
        for r in (ready, moved)
    ]

    with transaction.atomic(), sql.writes_at_end():
        assert move_all(batch, locked) == [True, False]
        assert Request.objects.get(pk=ready.pk).state == S.READY  # not yet written

    assert Request.objects.get(pk=ready.pk).state == S.PROCESSING
    assert Request.objects.get(pk=moved.pk).state == S.READY  # what was read is what counts
    assert list(Trace.objects.values_list("request_id", "to_state")) == [(ready.pk, S.PROCESSING)]
    with pytest.raises(ValueError):
        move_all(batch + batch[:1], locked)

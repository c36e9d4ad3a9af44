"""Two workers at once on the same rows: loads and slots decided by the database's locks,
dispatches and completions that keep the deployments' books, and the sends a completion
makes into the slot it frees. (Worker processes and leases: test_worker_process.py.)"""

import threading
import time
from collections.abc import Callable

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from backends.models import Deployment, DeploymentState, Server
from scheduler import channel_hints, store
from scheduler.models import Priority, Request, State, Worker
from scheduler.transitions import Transition
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState


def test_two_workers_never_start_two_loads_on_one_server():
    """Each worker plans on its own snapshot; the database has the last word."""
    a, b = (Worker.objects.create(host=h, pid=1) for h in "ab")
    srv = factories.server("s1", max_llm=2)
    first = factories.deployment(srv, "m1")
    second = factories.deployment(srv, "m2")
    assert store.start_load(first.pk, (), a.pk, "test") is not None
    assert store.start_load(second.pk, (), b.pk, "test") is None  # s1 is busy loading m1
    assert store.start_load(first.pk, (), b.pk, "test") is None  # and m1 is taken
    states = dict(Deployment.objects.values_list("model__name", "state"))
    assert states == {"m1": DS.LOADING, "m2": DS.UNLOADED}


def test_two_workers_never_overfill_a_models_own_slots():
    """The server has room for 4, the model for 1 (its `slots`): the second send is refused
    by the database, whatever the worker's plan said, and another model's is not."""
    a, b = (Worker.objects.create(host=h, pid=1) for h in "ab")
    srv = factories.server("s1", slots=4, max_llm=2)
    d = factories.deployment(srv, "m1", state=DS.LOADED, slots=1)
    other = factories.deployment(srv, "m2", state=DS.LOADED)
    first, second = (factories.request("m1", state=State.READY, deployment=d) for _ in "12")
    third = factories.request("m2", state=State.READY, deployment=other)
    assert store.dispatch_all([(first.pk, d.pk)], a.pk) != [None]
    assert store.dispatch_all([(second.pk, d.pk), (third.pk, other.pk)], b.pk)[0] is None
    assert Request.objects.get(pk=second.pk).state == State.READY
    assert Request.objects.get(pk=third.pk).state == State.PROCESSING


def test_two_workers_never_overfill_a_servers_slots():
    a, b = (Worker.objects.create(host=h, pid=1) for h in "ab")
    d = factories.deployment(factories.server("s1", slots=1), "m1", state=DS.LOADED)
    first, second = (factories.request("m1", state=State.READY, deployment=d) for _ in "12")
    assert store.dispatch_all([(first.pk, d.pk)], a.pk) != [None]
    assert store.dispatch_all([(second.pk, d.pk)], b.pk) == [None]
    second.refresh_from_db()
    assert second.state == State.READY and not second.traces.exists()
    assert Deployment.objects.get().in_flight == 1


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="row locks need PostgreSQL")
def test_a_dispatch_that_waited_for_the_servers_lock_counts_what_the_holder_sent():
    """The requests in flight are read after the server's lock is ours: read with the lock,
    they would be as of before the holder's commit."""
    a, b = (Worker.objects.create(host=h, pid=1) for h in "ab")
    d = factories.deployment(factories.server("s1", slots=1), "m1", state=DS.LOADED)
    first, second = (factories.request("m1", state=State.READY, deployment=d) for _ in "12")

    with transaction.atomic():
        assert store.dispatch_all([(first.pk, d.pk)], a.pk) != [None]
        theirs = another_worker_waits([(second.pk, d.pk)], b.pk)
    assert theirs() == [None]
    assert Deployment.objects.get().in_flight == 1


def another_worker_waits(sends: list, worker_id: int) -> Callable[[], list]:
    """Inside a transaction that holds a server's lock: another worker's dispatch of
    `sends`, in a thread and a connection of its own, once it waits for that lock. Call
    what it returns after the transaction ends for that dispatch's jobs."""
    jobs: list = []
    errors: list[BaseException] = []

    def dispatch() -> None:
        try:
            jobs.extend(store.dispatch_all(sends, worker_id))
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)
        finally:
            connection.close()

    waiting = threading.Thread(target=dispatch)
    waiting.start()
    until_a_query_waits_for_a_lock(waiting)

    def joined() -> list:
        waiting.join()
        if errors:
            raise errors[0]
        return jobs

    return joined


def until_a_query_waits_for_a_lock(thread: threading.Thread, timeout_s: float = 60) -> None:
    """Return once a session on the test database waits for a lock. Fails at once if
    `thread` ends first, and after `timeout_s` (well past the pool's 30 s wait for a
    connection) with what each session and the pool were doing."""
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            # Inside a transaction PostgreSQL answers pg_stat_activity from a snapshot taken
            # at its first read: each look must drop it, or a session that began to wait
            # after the first look is never seen.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            if not thread.is_alive():
                raise AssertionError("the other worker's dispatch ended without waiting")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 60)"
            " FROM pg_stat_activity WHERE datname = current_database()"
        )
        sessions = cursor.fetchall()
    pool = connection.pool.get_stats() if connection.pool else None
    raise AssertionError(f"no query came to wait for a lock; sessions {sessions}, pool {pool}")


def test_one_batch_of_dispatches_fills_free_slots_and_no_more():
    w = Worker.objects.create(host="a", pid=1)
    srv = factories.server("s1", slots=2, max_llm=2)
    d1 = factories.deployment(srv, "m1", state=DS.LOADED)
    d2 = factories.deployment(srv, "m2", state=DS.LOADED)
    gone = factories.deployment(factories.server("s2"), "m1", state=DS.UNLOADED)
    r1, r2, r4 = (factories.request("m1", state=State.READY) for _ in range(3))
    r3, wrong = (factories.request("m2", state=State.READY) for _ in range(2))

    jobs = store.dispatch_all(
        [(r1.pk, d1.pk), (r2.pk, gone.pk), (wrong.pk, d1.pk), (r3.pk, d2.pk), (r4.pk, d1.pk)],
        w.pk,
    )

    # r2's model is not loaded there; an m2 request never goes to m1, though a slot is
    # free; r4 finds s1's two slots taken by r1 and r3.
    assert [job is not None for job in jobs] == [True, False, False, True, False]
    assert jobs[3].call.server_model_id == "m2"
    states = dict(Request.objects.values_list("pk", "state"))
    assert [states[r.pk] for r in (r1, r2, wrong, r3, r4)] == [
        State.PROCESSING,
        State.READY,
        State.READY,
        State.PROCESSING,
        State.READY,
    ]
    assert dict(Deployment.objects.values_list("pk", "in_flight")) == {
        d1.pk: 1,
        d2.pk: 1,
        gone.pk: 0,
    }


def test_a_batch_of_dispatches_and_completions_keeps_the_deployments_books():
    """Sent together, finished together: in-flight counts, the last class served and the
    moving average of inference time come out as if each had been written alone."""
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(
        factories.server("s1", slots=4), "m1", state=DS.LOADED, avg_inference_s=1.0
    )
    urgent = factories.request("m1", Priority.INTERACTIVE, state=State.READY, deployment=d)
    calm = [factories.request("m1", state=State.READY, deployment=d) for _ in range(2)]

    jobs = store.dispatch_all([(r.pk, d.pk) for r in (urgent, *calm)], w.pk)

    d.refresh_from_db()
    assert d.in_flight == 3 and d.last_priority == calm[-1].priority
    assert d.last_interactive_at is not None
    first_two = zip(jobs[:2], (2, 3), strict=True)
    answers = [store.Answer(job, {"ok": i}, s) for i, (job, s) in enumerate(first_two)]
    assert store.requests_completed(answers) == [True, True]

    d.refresh_from_db()
    assert d.in_flight == 1
    assert d.avg_inference_s == pytest.approx(0.8 * (0.8 * 1.0 + 0.2 * 2) + 0.2 * 3)
    stored = dict(Request.objects.values_list("pk", "result"))
    assert [stored[job.request_id] for job in jobs[:2]] == [{"ok": 0}, {"ok": 1}]


def test_the_first_measurements_start_the_moving_average():
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=2), "m1", state=DS.LOADED)
    ready = [factories.request("m1", state=State.READY, deployment=d) for _ in range(2)]
    jobs = store.dispatch_all([(r.pk, d.pk) for r in ready], w.pk)

    store.requests_completed(
        [store.Answer(job, {}, s) for job, s in zip(jobs, (2, 4), strict=True)]
    )

    d.refresh_from_db()
    assert d.in_flight == 0 and d.avg_inference_s == pytest.approx(0.8 * 2 + 0.2 * 4)


def test_a_token_count_is_no_measurement_of_a_run():
    """Anthropic's count of a message's tokens takes milliseconds on the model's server: it
    frees its slot but leaves the run time of the model's generations as it was."""
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(
        factories.server("s1", slots=2), "m1", state=DS.LOADED, avg_inference_s=5.0
    )
    counts = factories.request("m1", state=State.READY, deployment=d, kind="count_tokens")
    chat = factories.request("m1", state=State.READY, deployment=d)
    jobs = store.dispatch_all([(counts.pk, d.pk), (chat.pk, d.pk)], w.pk)
    assert [job.call.kind for job in jobs] == ["count_tokens", "chat"]

    store.requests_completed([store.Answer(jobs[0], {"input_tokens": 9}, 0.004)])
    d.refresh_from_db()
    assert d.in_flight == 1 and d.avg_inference_s == 5.0
    store.requests_completed([store.Answer(jobs[1], {}, 10.0)])
    d.refresh_from_db()
    assert d.in_flight == 0 and d.avg_inference_s == pytest.approx(0.8 * 5 + 0.2 * 10)


def test_a_completion_after_a_take_over_writes_and_announces_nothing(monkeypatch):
    """A completion is written in one round trip, its trace row and the deployment's books
    each on the condition that its end was made: a request that another worker now holds
    keeps its state, and the books count only the end that was made."""
    mine, theirs = (Worker.objects.create(host=h, pid=1) for h in ("a", "b"))
    d = factories.deployment(
        factories.server("s1", slots=2), "m1", state=DS.LOADED, avg_inference_s=1.0
    )
    kept, taken = (factories.request("m1", state=State.READY, deployment=d) for _ in range(2))
    jobs = store.dispatch_all([(kept.pk, d.pk), (taken.pk, d.pk)], mine.pk)
    Request.objects.filter(pk=taken.pk).update(worker=theirs)  # taken over, sent again
    announced: list = []
    monkeypatch.setattr(
        channel_hints, "request_moved", lambda rid, state, outcome: announced.append((rid, state))
    )

    seconds = zip(jobs, (2, 4), strict=True)
    answers = [store.Answer(job, {"ok": i}, s) for i, (job, s) in enumerate(seconds)]
    assert store.requests_completed(answers) == [True, False]

    taken.refresh_from_db()
    assert (taken.state, taken.result, taken.finished_at) == (State.PROCESSING, None, None)
    assert not taken.traces.filter(to_state=State.COMPLETED).exists()
    assert kept.traces.filter(to_state=State.COMPLETED).count() == 1
    d.refresh_from_db()
    assert d.in_flight == 1 and d.avg_inference_s == pytest.approx(0.8 * 1.0 + 0.2 * 2)
    assert announced == [(kept.pk, State.COMPLETED)]


def one_busy_slot(queued: int = 1):
    """A one-slot server serving one request, `queued` more ready for it."""
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=1), "m1", state=DS.LOADED)
    served = factories.request("m1", state=State.READY, deployment=d)
    [job] = store.dispatch_all([(served.pk, d.pk)], w.pk)
    ready = [factories.request("m1", state=State.READY, deployment=d) for _ in range(queued)]
    return w, d, job, ready


def test_a_completion_sends_the_request_planned_for_its_slot():
    """The freed slot is filled in the completion's own transaction, before its commit (the
    call starts at `send_now`): one slot, never two requests in it."""
    w, d, job, [following] = one_busy_slot()
    sent: list[store.ServeJob] = []

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=planned(following, d))
    assert store.requests_completed([answer], send_now=sent.extend) == [True]

    assert [(j.request_id, j.deployment_id, j.worker_id) for j in sent] == [
        (following.pk, d.pk, w.pk)
    ]
    following.refresh_from_db()
    assert following.state == State.PROCESSING and following.worker_id == w.pk
    assert following.traces.get().reason == "sent to the server as a slot freed there"
    assert Request.objects.get(pk=job.request_id).state == State.COMPLETED
    d.refresh_from_db()
    assert d.in_flight == 1


def test_no_send_in_a_slot_that_a_refused_completion_did_not_free():
    """Taken over meanwhile: the completion is not ours to write, nor the slot to fill."""
    _, d, job, [following] = one_busy_slot()
    theirs = Worker.objects.create(host="b", pid=1)
    Request.objects.filter(pk=job.request_id).update(worker=theirs)
    sent: list[store.ServeJob] = []

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=planned(following, d))
    assert store.requests_completed([answer], send_now=sent.extend) == [False]

    assert sent == []
    following.refresh_from_db()
    d.refresh_from_db()
    assert following.state == State.READY and d.in_flight == 1


def test_a_planned_request_gone_meanwhile_leaves_the_slot_free():
    _, d, job, [following] = one_busy_slot()
    Request.objects.filter(pk=following.pk).update(state=State.CANCELLED)
    sent: list[store.ServeJob] = []

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=planned(following, d))
    assert store.requests_completed([answer], send_now=sent.extend) == [True]

    assert sent == []
    d.refresh_from_db()
    assert d.in_flight == 0


@pytest.mark.parametrize(
    "change", [{"enabled": False}, {"health": "down"}, {"health": "cooldown"}], ids=str
)
def test_no_send_to_a_server_taken_out_of_service_since_the_plan(change):
    """A planned send may be as old as an inference: the server's state at the lock wins."""
    _, d, job, [following] = one_busy_slot()
    Server.objects.filter(pk=d.server_id).update(**change)
    sent: list[store.ServeJob] = []

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=planned(following, d))
    assert store.requests_completed([answer], send_now=sent.extend) == [True]

    assert sent == [] and store.dispatch_all([(following.pk, d.pk)], job.worker_id) == [None]
    following.refresh_from_db()
    assert following.state == State.READY


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="row locks need PostgreSQL")
def test_a_completion_that_fills_its_slot_holds_the_server_until_it_commits():
    """Another worker's dispatch waits for the server's lock and then counts the request
    sent into the freed slot: one slot, one request in it."""
    _, d, job, [following, other] = one_busy_slot(queued=2)
    them = Worker.objects.create(host="b", pid=1)
    sent: list[store.ServeJob] = []
    with transaction.atomic():
        answer = store.Answer(job, {"ok": 1}, 0.5, then_send=planned(following, d))
        assert store.requests_completed([answer], send_now=sent.extend) == [True]
        theirs = another_worker_waits([(other.pk, d.pk)], them.pk)
    assert [j.request_id for j in sent] == [following.pk] and theirs() == [None]
    assert Deployment.objects.get().in_flight == 1


def test_a_request_named_twice_in_a_batch_is_sent_once():
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=4), "m1", state=DS.LOADED)
    r = factories.request("m1", state=State.READY, deployment=d)

    jobs = store.dispatch_all([(r.pk, d.pk), (r.pk, d.pk)], w.pk)

    assert [job is not None for job in jobs] == [True, False]
    d.refresh_from_db()
    assert d.in_flight == 1 and r.traces.count() == 1


def route(request: Request, d: Deployment) -> Transition:
    fields = {"deployment_id": d.pk, "server_id": d.server_id, "routed_at": timezone.now()}
    return Transition(request.pk, (State.PENDING,), State.READY, "its model is loaded", fields)


def test_a_request_routed_and_sent_in_one_pass_moves_once_and_traces_both_steps():
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=1), "m1", state=DS.LOADED)
    r = factories.request("m1")

    results, jobs = store.move_and_dispatch([route(r, d)], [(r.pk, d.pk)], w.pk)

    assert results == [True] and jobs[0].request_id == r.pk
    r.refresh_from_db()
    assert (r.state, r.deployment_id, r.worker_id) == (State.PROCESSING, d.pk, w.pk)
    assert r.routed_at and r.started_at
    steps = list(r.traces.order_by("id").values_list("from_state", "to_state", "reason"))
    assert steps == [
        (State.PENDING, State.READY, "its model is loaded"),
        (State.READY, State.PROCESSING, "sent to the server"),
    ]


def test_a_routed_request_that_finds_no_slot_is_routed_all_the_same():
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=1), "m1", state=DS.LOADED, in_flight=1)
    r = factories.request("m1")

    results, jobs = store.move_and_dispatch([route(r, d)], [(r.pk, d.pk)], w.pk)

    assert results == [True] and jobs == [None]
    r.refresh_from_db()
    assert (r.state, r.deployment_id) == (State.READY, d.pk)
    assert list(r.traces.values_list("to_state", flat=True)) == [State.READY]


def test_a_request_cancelled_before_its_route_and_send_is_neither():
    w = Worker.objects.create(host="a", pid=1)
    d = factories.deployment(factories.server("s1", slots=1), "m1", state=DS.LOADED)
    r = factories.request("m1", state=State.CANCELLED)

    results, jobs = store.move_and_dispatch([route(r, d)], [(r.pk, d.pk)], w.pk)

    assert results == [False] and jobs == [None]
    r.refresh_from_db()
    assert r.state == State.CANCELLED and not r.traces.exists()
    assert Deployment.objects.get(pk=d.pk).in_flight == 0


def planned(request: Request, d: Deployment) -> store.PlannedSend:
    """`request` as a pass planned it for a slot freeing on `d`'s server."""
    return store.PlannedSend(request.pk, d.pk, request.priority, 0, plan=1)

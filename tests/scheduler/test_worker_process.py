"""Workers and leases: heartbeats, taking over the work of a dead worker, clean stops, and
crash safety proven with real `manage.py run_scheduler` processes."""

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from backends.adapters.simulated import simulated_server
from backends.models import Deployment, DeploymentState, Server
from scheduler import channel_hints, store, wakeup
from scheduler.models import Priority, Request, State, Worker
from scheduler.runtime import Runtime
from scheduler.transitions import Transition
from tests import factories
from tests.conftest import database_url
from tests.support.manage_process import ManageProcess
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async
DS = DeploymentState
LONG_AGO = timedelta(hours=1)


class WorkerProcess(ManageProcess):
    """`manage.py run_scheduler` on the test database; returns once it says it started."""

    def __init__(self, *args: str, drain_s: float = 0, name: str = "switchyard-worker") -> None:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SWITCHYARD_POLL_INTERVAL_S": "1",
            "SWITCHYARD_DRAIN_S": str(drain_s),
            "PGAPPNAME": name,  # its connections' application_name, as PostgreSQL lists them
        }
        super().__init__(["run_scheduler", *args], env, lambda line: " started" in line)
        self.worker_id = int(self.log[-1].split("worker ")[1].split()[0])

    def finish(self, timeout: float = 60) -> str:
        return self.output(timeout)


def setup_upstream_server(upstream: Upstream) -> Request:
    srv = factories.server("up", kind="openai", base_url=upstream.url)
    factories.deployment(srv, "m1", state=DS.LOADED)
    return factories.request("m1")


def traces(request: Request) -> list[tuple[str, str, str]]:
    return list(request.traces.values_list("from_state", "to_state", "reason"))


def runs_again_after_take_over(request: Request, dead: WorkerProcess, upstream: Upstream) -> None:
    """The next worker takes over what `dead` held and runs `request` again, to its end (its
    heartbeat aged by hand: no wait for WORKER_STALE_S)."""
    Worker.objects.filter(pk=dead.worker_id).update(last_heartbeat=timezone.now() - LONG_AGO)
    second = WorkerProcess("--until-idle")
    out = second.finish()
    assert second.proc.returncode == 0, out
    request.refresh_from_db()
    assert request.state == State.COMPLETED, traces(request)
    assert request.attempts == 2
    assert len(upstream.received) == 2


def test_a_killed_worker_loses_no_request(gated_upstream):
    request = setup_upstream_server(gated_upstream)
    first = WorkerProcess()
    assert gated_upstream.arrived.wait(30)  # the request is at the server: processing
    request.refresh_from_db()
    assert (request.state, request.worker_id) == (State.PROCESSING, first.worker_id)

    first.proc.kill()  # SIGKILL: no cleanup of any kind
    first.proc.wait(timeout=30)
    gated_upstream.gate.set()

    runs_again_after_take_over(request, first, gated_upstream)
    assert (State.PROCESSING, State.PENDING) in [(f, t) for f, t, _ in traces(request)]
    assert any("stopped heartbeating" in reason for *_, reason in traces(request))
    assert not Worker.objects.exists()
    assert Deployment.objects.get().in_flight == 0


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="a connection to end: PostgreSQL's")
def test_a_worker_that_loses_the_database_starts_again_and_its_work_runs_again(gated_upstream):
    """Every connection ends, as in a restart or a failover: the worker neither exits nor
    carries on as if its commits were kept. It hands back what it held and starts again
    under a new lease, with a line in its log and no traceback."""
    request = setup_upstream_server(gated_upstream)
    first = WorkerProcess("--until-idle", name="doomed-worker")
    assert gated_upstream.arrived.wait(30)

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity"
            " WHERE application_name = 'doomed-worker'"
        )
        assert cursor.fetchone()[0] >= 2  # its database thread's, and its LISTEN
    gated_upstream.gate.set()  # its answer comes to a worker that cannot store it
    out = first.finish()
    assert first.proc.returncode == 0, out
    assert f"worker {first.worker_id} lost the database" in out
    assert "Traceback" not in out, out
    request.refresh_from_db()
    assert (request.state, request.attempts) == (State.COMPLETED, 2), traces(request)
    handed_back = (State.PROCESSING, State.PENDING, "its worker stopped; it will run again")
    assert handed_back in traces(request)
    assert len(gated_upstream.received) == 2
    assert not Worker.objects.exists()


def test_sigterm_stops_cleanly_hands_back_its_work_and_removes_its_row(gated_upstream):
    request = setup_upstream_server(gated_upstream)
    worker = WorkerProcess()
    assert Worker.objects.filter(pk=worker.worker_id).exists()
    assert gated_upstream.arrived.wait(30)

    worker.proc.send_signal(signal.SIGTERM)
    out = worker.finish()
    assert worker.proc.returncode == 0, out
    assert f"worker {worker.worker_id} stopped" in out
    assert not Worker.objects.exists()
    request.refresh_from_db()
    assert request.state == State.PENDING  # handed back, not lost
    assert "its worker stopped" in traces(request)[-1][2]
    assert Deployment.objects.get().in_flight == 0  # the next worker runs it again


def test_sigterm_lets_a_request_at_its_server_finish_first(gated_upstream):
    request = setup_upstream_server(gated_upstream)
    worker = WorkerProcess(drain_s=60)
    assert gated_upstream.arrived.wait(30)

    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_for_line("draining: 1 request(s)")
    gated_upstream.gate.set()  # the server answers while the worker drains
    out = worker.finish()

    assert worker.proc.returncode == 0, out
    request.refresh_from_db()
    assert request.state == State.COMPLETED, out
    assert len(gated_upstream.received) == 1  # finished once, not run again
    assert not Worker.objects.exists()


async def test_a_worker_keeps_its_heartbeat_fresh(knobs):
    # A heartbeat is no event for the loop: a short poll lets `until` look again.
    knobs(HEARTBEAT_S=0.05, POLL_INTERVAL_S=0.05)
    async with Running() as running:
        worker = await running.until(lambda: Worker.objects.first())
        await running.until(
            lambda: Worker.objects.get(pk=worker.pk).last_heartbeat > worker.last_heartbeat
        )


async def test_a_heartbeat_that_lost_the_database_stops_the_worker_with_that_error(
    monkeypatch, caplog
):
    """Not a wrapper of it: `run_scheduler` tells a lost database by its type, and exits
    with one line instead of a traceback."""

    def lost(worker_id: int) -> bool:
        raise OperationalError("the connection to the database was lost")

    async def not_listening(listener) -> None:  # a LISTEN cut off mid-connect outlives the test
        await asyncio.Event().wait()

    monkeypatch.setattr(store, "heartbeat", lost)
    monkeypatch.setattr(wakeup, "listen_postgres", not_listening)
    with pytest.raises(OperationalError, match="was lost"):
        await Runtime().run(asyncio.Event())
    assert "side task heartbeat crashed" in caplog.text


async def test_a_worker_taken_over_while_alive_carries_on_under_a_new_row(knobs):
    knobs(HEARTBEAT_S=0.05, POLL_INTERVAL_S=0.05)
    async with Running() as running:
        first = await running.until(lambda: Worker.objects.first())
        await db(Worker.objects.all().delete)()  # what another worker does to a stale one
        second = await running.until(lambda: Worker.objects.first())
        assert second.pk != first.pk
        assert running.runtime.worker_id == second.pk


async def test_on_start_a_worker_takes_back_what_a_stale_worker_held():
    def setup():
        stale = Worker.objects.create(host="gone", pid=1, last_heartbeat=timezone.now() - LONG_AGO)
        srv = factories.server("s1", max_llm=2)
        factories.deployment(srv, "m1", state=DS.LOADED, in_flight=1)
        factories.deployment(srv, "m2", state=DS.LOADING, worker=stale)
        simulated_server("s1").loaded.add("m1")  # m2's load died with its worker
        d = Deployment.objects.get(model__name="m1")
        return factories.request(
            "m1", state=State.PROCESSING, worker=stale, deployment=d, server=srv, attempts=1
        )

    request = await db(setup)()
    await Runtime().run(asyncio.Event(), until_idle=True)

    def check():
        request.refresh_from_db()
        assert request.state == State.COMPLETED
        assert [t for f, t, _ in traces(request)][:1] == [State.PENDING]
        assert not Worker.objects.exists()
        states = dict(Deployment.objects.values_list("model__name", "state"))
        assert states == {"m1": DS.LOADED, "m2": DS.UNLOADED}  # re-checked with the server
        assert Deployment.objects.get(model__name="m1").in_flight == 0

    await db(check)()


async def test_a_live_workers_long_load_is_never_taken_over():
    def setup():
        busy = Worker.objects.create(host="elsewhere", pid=1)  # heartbeat: now
        factories.deployment(factories.server("s1"), "m1", state=DS.LOADING, worker=busy)
        return busy

    busy = await db(setup)()
    runtime = Runtime()
    await runtime.start()
    await runtime.stop()
    d = await Deployment.objects.aget()
    assert (d.state, d.worker_id) == (DS.LOADING, busy.pk)
    assert await Worker.objects.filter(pk=busy.pk).aexists()


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

    def dispatch() -> None:
        try:
            jobs.extend(store.dispatch_all(sends, worker_id))
        finally:
            connection.close()

    waiting = threading.Thread(target=dispatch)
    waiting.start()
    until_a_query_waits_for_a_lock()

    def joined() -> list:
        waiting.join()
        return jobs

    return joined


def until_a_query_waits_for_a_lock(timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
    raise AssertionError("no query came to wait for a lock")


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

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=(following.pk, d.pk))
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

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=(following.pk, d.pk))
    assert store.requests_completed([answer], send_now=sent.extend) == [False]

    assert sent == []
    following.refresh_from_db()
    d.refresh_from_db()
    assert following.state == State.READY and d.in_flight == 1


def test_a_planned_request_gone_meanwhile_leaves_the_slot_free():
    _, d, job, [following] = one_busy_slot()
    Request.objects.filter(pk=following.pk).update(state=State.CANCELLED)
    sent: list[store.ServeJob] = []

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=(following.pk, d.pk))
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

    answer = store.Answer(job, {"ok": 1}, 0.5, then_send=(following.pk, d.pk))
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
        answer = store.Answer(job, {"ok": 1}, 0.5, then_send=(following.pk, d.pk))
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


def test_a_draining_worker_keeps_its_lease(gated_upstream, monkeypatch):
    """A drain longer than the stale time must not hand what still runs to another worker."""
    monkeypatch.setenv("SWITCHYARD_HEARTBEAT_S", "0.1")
    request = setup_upstream_server(gated_upstream)
    worker = WorkerProcess(drain_s=60)
    assert gated_upstream.arrived.wait(30)

    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_for_line("draining: 1 request(s)")
    began = Worker.objects.get(pk=worker.worker_id).last_heartbeat
    deadline = time.monotonic() + 30
    # Another process's heartbeat: poll its row until it moves on.
    while Worker.objects.get(pk=worker.worker_id).last_heartbeat <= began:
        assert time.monotonic() < deadline, "no heartbeat while draining"
        time.sleep(0.05)
    assert store.take_over_stale_workers(stale_s=5) == (0, [])  # its lease is fresh
    gated_upstream.gate.set()
    out = worker.finish()

    assert worker.proc.returncode == 0, out
    request.refresh_from_db()
    assert (request.state, request.attempts) == (State.COMPLETED, 1), out
    assert len(gated_upstream.received) == 1

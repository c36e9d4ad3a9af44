"""Workers and leases: heartbeats, taking over the work of a dead worker, clean stops, and
crash safety proven with real `manage.py run_scheduler` processes."""

import asyncio
import os
import signal
import subprocess
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError, connection
from django.utils import timezone

from backends.adapters.simulated import simulated_server
from backends.models import Deployment, DeploymentState
from scheduler import store, wakeup
from scheduler.models import Request, State, Worker
from scheduler.runtime import Runtime
from tests import factories
from tests.conftest import database_url
from tests.support.manage_process import ManageProcess
from tests.support.openai_upstream import Upstream
from tests.support.polling import eventually
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


def runs_again_after_take_over(request: Request, upstream: Upstream) -> None:
    """The next worker, started on this machine, takes over what a dead one held at once (its
    process has exited: no wait for WORKER_STALE_S) and runs `request` again, to its end."""
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

    assert Worker.objects.get(pk=first.worker_id).last_heartbeat > timezone.now() - LONG_AGO
    runs_again_after_take_over(request, gated_upstream)
    assert (State.PROCESSING, State.PENDING) in [(f, t) for f, t, _ in traces(request)]
    assert any("process exited" in reason for *_, reason in traces(request))
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
    try:
        out = first.finish()
    except AssertionError as stuck:
        request.refresh_from_db()
        rows = (
            (request.state, request.worker_id, request.attempts, traces(request)),
            list(Deployment.objects.values("state", "in_flight", "worker_id")),
            list(Worker.objects.values_list("pk", flat=True)),
        )
        raise AssertionError(f"{stuck}\nrows (request, deployments, workers): {rows}") from None
    assert first.proc.returncode == 0, out
    assert f"worker {first.worker_id} lost the database" in out
    assert "Traceback" not in out, out
    request.refresh_from_db()
    # Either outcome is right, by which the worker meets first: the answer's write on a dead
    # connection (it hands the request back, and it runs again), or a fresh connection (its
    # lease still holds, and the answer is stored). Its other dead connection (the LISTEN)
    # may make it start again once more, handing back a send before its call. Never a run
    # the row does not count.
    assert request.state == State.COMPLETED, traces(request)
    assert 1 <= len(gated_upstream.received) <= request.attempts, traces(request)
    handed_back = (State.PROCESSING, State.PENDING, "its worker stopped; it will run again")
    assert (handed_back in traces(request)) == (request.attempts > 1), traces(request)
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

        def carried_on() -> Worker | None:
            # The new row is committed before the runtime takes its id: wait for both.
            now_id = running.runtime.worker_id
            return Worker.objects.filter(pk=now_id).first() if now_id != first.pk else None

        second = await running.until(carried_on)
        assert second.pk != first.pk
        assert await db(lambda: list(Worker.objects.all()))() == [second]


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


def test_a_hand_back_cut_short_by_a_fault_leaves_all_of_it_to_do_again(monkeypatch):
    """Seen with a backend terminated mid-way: the request moved back but the slot count
    not recounted, so the next worker never sent it. All of a hand-back, or none of it."""
    srv = factories.server("s1")
    worker = Worker.objects.create(host="here", pid=1)
    d = factories.deployment(srv, "m1", state=DS.LOADED, in_flight=1, worker=worker)
    request = factories.request(
        "m1", state=State.PROCESSING, worker=worker, deployment=d, server=srv, attempts=1
    )

    def cut(*args):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(store.workers, "recount_in_flight", cut)
    with pytest.raises(OperationalError):
        store.release_worker(worker.pk)
    request.refresh_from_db()
    assert (request.state, request.worker_id) == (State.PROCESSING, worker.pk)
    assert Worker.objects.filter(pk=worker.pk).exists()

    monkeypatch.undo()
    assert store.release_worker(worker.pk) == (1, [])  # done again, whole
    request.refresh_from_db()
    assert request.state == State.PENDING
    assert Deployment.objects.get(pk=d.pk).in_flight == 0


def test_a_worker_on_this_machine_whose_process_exited_is_taken_over_at_once():
    """Its heartbeat is fresh, but its pid is gone: dead. A live pid here, or a pid on
    another machine (or a worker that did not say its machine), waits for the stale time."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    machine = store.workers.MACHINE
    dead = Worker.objects.create(host="here", pid=ended.pid, machine=machine)
    alive = Worker.objects.create(host="here", pid=os.getpid(), machine=machine)
    elsewhere = Worker.objects.create(host="there", pid=ended.pid, machine="another/boot")
    unsaid = Worker.objects.create(host="old", pid=ended.pid)
    srv = factories.server("s1")
    d = factories.deployment(srv, "m1", state=DS.LOADED, in_flight=1, worker=dead)
    request = factories.request(
        "m1", state=State.PROCESSING, worker=dead, deployment=d, server=srv, attempts=1
    )

    assert store.take_over_stale_workers(stale_s=30) == (1, [])
    assert set(Worker.objects.values_list("pk", flat=True)) == {alive.pk, elsewhere.pk, unsaid.pk}
    request.refresh_from_db()
    assert request.state == State.PENDING
    assert "process exited" in traces(request)[-1][2]


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


def test_a_draining_worker_keeps_its_lease(gated_upstream, monkeypatch):
    """A drain longer than the stale time must not hand what still runs to another worker."""
    monkeypatch.setenv("SWITCHYARD_HEARTBEAT_S", "0.1")
    request = setup_upstream_server(gated_upstream)
    worker = WorkerProcess(drain_s=60)
    assert gated_upstream.arrived.wait(30)

    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_for_line("draining: 1 request(s)")
    began = Worker.objects.get(pk=worker.worker_id).last_heartbeat
    # Another process's heartbeat: poll its row until it moves on.
    eventually(
        lambda: Worker.objects.get(pk=worker.worker_id).last_heartbeat > began,
        what="a heartbeat while draining",
    )
    assert store.take_over_stale_workers(stale_s=5) == (0, [])  # its lease is fresh
    gated_upstream.gate.set()
    out = worker.finish()

    assert worker.proc.returncode == 0, out
    request.refresh_from_db()
    assert (request.state, request.attempts) == (State.COMPLETED, 1), out
    assert len(gated_upstream.received) == 1

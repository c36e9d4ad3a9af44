"""Two workers racing on PostgreSQL: one lock order everywhere (servers, deployments,
requests), a lost conflict retried, never fatal. Thousands of mixed requests arrive in waves
while both `manage.py run_scheduler` processes plan, send on arrival, complete and fill the
slots that free: no worker exits, no request stays behind, none runs twice.

SWITCHYARD_RACE_REQUESTS sets how many (3,000 by default: about a minute on 2 cores)."""

import os
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from backends.models import DeploymentState
from scheduler import wakeup
from scheduler.models import TERMINAL_STATES, Priority, Request, State, Trace
from scheduler.wakeup import Arrival
from tests import factories
from tests.scheduler.test_worker_process import WorkerProcess
from tests.support.openai_upstream import Upstream
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("db_thread_closed"),
    pytest.mark.skipif(not settings.IS_POSTGRES, reason="row locks and deadlocks: PostgreSQL's"),
]
REQUESTS = int(os.environ.get("SWITCHYARD_RACE_REQUESTS", "3000"))
WAVE = 60  # requests inserted (and announced) in one transaction
DEADLINE_S = 600.0  # bounds a test that would otherwise hang; it takes far less
PRIORITIES = [
    Priority.INTERACTIVE,
    Priority.NORMAL,
    Priority.NORMAL,
    Priority.BACKGROUND,
    Priority.HIGH,
]


def wave(models: dict[str, object], start: int) -> None:
    """`WAVE` requests of mixed models and classes, each announced as the API announces one."""
    now = timezone.now()
    rows = []
    for i in range(start, start + WAVE):
        name = ["m1", "m2"][i % 2]
        rows.append(
            Request(
                id=uuid.uuid4(),
                kind="chat",
                model_name=name,
                model=models[name],
                payload={"model": name, "messages": [{"role": "user", "content": "hi"}]},
                priority=PRIORITIES[i % len(PRIORITIES)],
                expires_at=now + timedelta(seconds=DEADLINE_S),
            )
        )
    with transaction.atomic():
        Request.objects.bulk_create(rows)
        for r in rows:
            wakeup.notify_in_transaction(Arrival(r.priority, r.id, r.model_name))


def until_all_finished(workers: list[WorkerProcess]) -> None:
    """Poll the table (the workers are other processes: nothing to await) until every request
    has ended, or a worker died."""
    deadline = time.monotonic() + DEADLINE_S
    while Request.objects.exclude(state__in=TERMINAL_STATES).exists():
        for w in workers:
            assert w.proc.poll() is None, f"a worker exited:\n{''.join(w.log)}"
        assert time.monotonic() < deadline, Request.objects.values("state").annotate(n=Count("id"))
        time.sleep(0.2)


def deadlocks() -> int:
    """The deadlocks PostgreSQL has detected in this database, ever (its statistics: they
    reach the view within its stats flush, so read after the workers have stopped)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_two_workers_racing_take_no_deadlock_leave_no_request_and_run_none_twice():
    before = deadlocks()
    upstream = Upstream(["m1", "m2"])
    try:
        for name in ("a", "b"):
            server = factories.server(name, kind="openai", base_url=upstream.url, slots=6)
            for model in ("m1", "m2"):
                factories.deployment(server, model, state=DeploymentState.LOADED)
        models = {name: factories.model(name) for name in ("m1", "m2")}
        workers = [WorkerProcess(name=f"racing-worker-{i}") for i in range(2)]
        for start in range(0, REQUESTS, WAVE):
            wave(models, start)
        until_all_finished(workers)
        # Both took part (else this raced nothing); asked before they stop and let go.
        took_part = Request.objects.values("worker").distinct().count()
        for w in workers:
            w.proc.terminate()
        logs = [w.finish() for w in workers]
    finally:
        upstream.close()

    for w, log in zip(workers, logs, strict=True):
        assert w.proc.returncode == 0, log
        assert "lost the database" not in log and "crashed" not in log, log
    states = dict(Request.objects.values_list("state").annotate(n=Count("id")))
    assert states == {State.COMPLETED: REQUESTS}, states
    # None ran twice: one send each, one call each at the server.
    assert set(Request.objects.values_list("attempts", flat=True)) == {1}
    sends = Trace.objects.filter(to_state=State.PROCESSING).count()
    assert sends == REQUESTS
    assert len(upstream.received) == REQUESTS
    assert took_part == 2
    # One lock order everywhere, foreign keys' checks included: no deadlock to retry.
    assert deadlocks() == before, [
        line for log in logs for line in log.splitlines() if "lock conflict" in line
    ]

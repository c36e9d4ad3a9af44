"""The fault suite: real processes on private services, a fault under load, then an audit.

The scenarios marked `full` run with `make test-faults` (SWITCHYARD_FAULTS=all); the
others also in CI's PostgreSQL pass. An xfail names a fault the workers do not yet
survive. Each prints its audit's summary line (pytest -s)."""

import os
import shutil
import signal
import time
from collections import Counter

import pytest
from django.conf import settings

from tests.faults.cluster import KNOBS, PG_BIN, Cluster
from tests.faults.load import FaultyUpstream, Load, audit
from tests.support.polling import eventually

FULL = os.environ.get("SWITCHYARD_FAULTS") == "all"
REDIS_DOWN_S = 20 if FULL else 3
QUEUE_BOUND = int(KNOBS["SWITCHYARD_MAX_QUEUE"])
GRACE_S = float(KNOBS["SWITCHYARD_NO_SERVER_GRACE_S"])
full = pytest.mark.skipif(not FULL, reason="make test-faults (SWITCHYARD_FAULTS=all)")
pytestmark = [
    pytest.mark.skipif(
        not (FULL or settings.IS_POSTGRES) or not PG_BIN or not shutil.which("redis-server"),
        reason="the fault suite runs in the PostgreSQL pass (needs initdb and redis-server)",
    ),
    pytest.mark.xdist_group("faults"),  # one cluster for the module, on one test worker
]


@pytest.fixture(scope="module")
def upstream():
    up = FaultyUpstream()
    yield up
    up.released.set()
    up.close()


@pytest.fixture(scope="module")
def cluster(upstream):
    started = Cluster(upstream.url)
    yield started
    started.close()


@pytest.fixture
def fresh(cluster, upstream):
    """Each scenario starts with no requests and a healthy upstream."""
    upstream.mode = "ok"
    upstream.released.clear()
    if upstream.httpd is None:
        upstream.start()
    upstream.hits.clear()
    eventually(lambda: cluster.pg.query("SELECT 1"), 30, "PostgreSQL")
    # The last scenario's faults behind it: the upstream up and its model loaded again.
    eventually(
        lambda: cluster.pg.query(
            "SELECT 1 FROM backends_server s JOIN backends_deployment d ON d.server_id = s.id"
            " WHERE s.health = 'up' AND d.state = 'loaded'"
        ),
        60,
        "the upstream to be up with its model loaded",
    )
    cluster.pg.query("TRUNCATE scheduler_request, scheduler_idempotencykey CASCADE")
    cluster.mark = {name: len(log) for name, log in cluster.logs().items()}
    cluster.restarts_before = sum(w.restarts for w in cluster.workers)
    return cluster


def served_again(load: Load, since: int) -> None:
    """Until a caller after the `since`th is served (the fault behind, the server back)."""
    served = lambda: any(o.status == 200 and not o.code for o in load.outcomes[since:])  # noqa: E731
    eventually(served, 120, "a caller served once the fault is over")


def waiting(cluster: Cluster) -> int:
    [(count,)] = cluster.pg.query(
        "SELECT count(*) FROM scheduler_request"
        " WHERE state IN ('pending', 'needs_loading', 'ready')"
    )
    return count


def settle(cluster: Cluster, timeout_s: float = 90) -> None:
    """Until every stored request has reached a terminal state."""
    eventually(
        lambda: (
            not cluster.pg.query(
                "SELECT 1 FROM scheduler_request WHERE state NOT IN"
                " ('completed', 'failed', 'cancelled', 'expired') LIMIT 1"
            )
        ),
        timeout_s,
        "every request to end",
    )


def audited(
    name: str,
    cluster: Cluster,
    upstream: FaultyUpstream,
    load: Load,
    quiet: bool = False,
    settle_s: float = 90,
):
    """The audit, and with `quiet`: no traceback in any log, no worker process restarted
    (a worker that loses the database starts its work again in its process)."""
    outcomes = load.finish()
    settle(cluster, settle_s)
    found = audit(name, outcomes, cluster.pg.query, upstream.hits)
    new = {name: log[cluster.mark.get(name, 0) :] for name, log in cluster.logs().items()}
    tracebacks = {name: log.count("Traceback") for name, log in new.items() if "Traceback" in log}
    restarts = sum(w.restarts for w in cluster.workers)
    print(f"\n{found.summary()}; tracebacks {tracebacks}; worker restarts so far {restarts}")
    assert not found.problems, found.problems[:10]
    if quiet:
        assert not tracebacks, tracebacks
        assert restarts == cluster.restarts_before, "a worker process exited"
    return found


@full
def test_postgresql_restarts_under_load(fresh, upstream):
    cluster = fresh
    load = Load(cluster.urls).start()
    load.wait_for(20)
    cluster.pg.pg_ctl("-w", "-m", "fast", "restart")
    back = len(load.outcomes)
    load.wait_for(back + 40)
    found = audited("postgresql restart", cluster, upstream, load, quiet=True)
    after = found.outcomes[back + 8 :]  # those sent once the pool had met the restart
    assert all(o.status == 200 for o in after), [(o.status, o.code) for o in after][:5]


def test_every_database_backend_is_terminated(fresh, upstream):
    cluster = fresh
    load = Load(cluster.urls).start()
    load.wait_for(20)
    ended = cluster.pg.terminate_backends()
    load.wait_for(len(load.outcomes) + 20)
    ended += cluster.pg.terminate_backends()
    load.wait_for(len(load.outcomes) + 20)
    audited(f"{ended} backends terminated", cluster, upstream, load, quiet=True)


def test_redis_stops_and_comes_back(fresh, upstream):
    cluster = fresh
    logs_before = {name: log.count("Redis is down") for name, log in cluster.logs().items()}
    load = Load(cluster.urls).start()
    load.wait_for(20)
    cluster.redis.stop()
    down_at = len(load.outcomes)
    time.sleep(REDIS_DOWN_S)  # the outage's length is the scenario, not a wait for an event
    during = load.outcomes[down_at:]
    cluster.redis.start()
    load.wait_for(len(load.outcomes) + 20)
    found = audited(f"redis down {REDIS_DOWN_S} s", cluster, upstream, load)
    finished = dict(
        cluster.pg.query(
            "SELECT payload->'messages'->0->>'content', extract(epoch from finished_at)"
            " FROM scheduler_request"
        )
    )
    late = [o.ended_at - float(finished[o.marker]) for o in during if o.stream and o.status]
    print(
        f"during the outage: {len(during)} answered; streamed callers had their end at most"
        f" {max(late, default=0):.2f} s after their row's"
    )
    assert during, "nothing was answered while Redis was down"
    # The goal is 1 s (a re-read every 0.5 s); on a 2-core machine under load, up to 2 s
    # was measured for a caller whose stream ended as Redis went down.
    assert max(late, default=0) < 3.0
    for name, log in cluster.logs().items():
        assert log.count("Redis is down") - logs_before[name] <= 1, name
    assert found


@full
def test_a_worker_killed_mid_load(fresh, upstream):
    cluster = fresh
    load = Load(cluster.urls).start()
    load.wait_for(20)
    victim = cluster.workers[0]
    victim.signal(signal.SIGKILL)  # its supervisor starts it again, as systemd would
    load.wait_for(len(load.outcomes) + 30)
    audited("worker kill -9", cluster, upstream, load)


@full
def test_a_worker_killed_mid_request(fresh, upstream):
    """Both workers hold requests at a stalled upstream; one dies; the other (or its
    restart) takes its work over at once: its process has exited on this machine."""
    cluster = fresh
    upstream.mode = "stall"
    load = Load(cluster.urls, callers=4).start()
    eventually(lambda: sum(upstream.hits.values()) >= 2, 30, "requests at the upstream")
    victim = cluster.workers[1]
    victim.signal(signal.SIGKILL)
    upstream.mode = "ok"
    upstream.released.set()
    load.wait_for(len(load.outcomes) + 8, timeout_s=90)
    audited("worker kill -9 mid-request", cluster, upstream, load)


@full
@pytest.mark.parametrize("mode", ["500", "cut"])  # cut: a model unloaded mid-stream
def test_upstream_fails_for_a_while(fresh, upstream, mode):
    load = Load(fresh.urls).start()
    load.wait_for(10)
    upstream.mode = mode
    load.wait_for(len(load.outcomes) + 10)
    upstream.mode = "ok"
    served_again(load, len(load.outcomes))
    audited(f"upstream {mode}", fresh, upstream, load)


@full
def test_upstream_stalls_then_answers(fresh, upstream):
    load = Load(fresh.urls).start()
    load.wait_for(10)
    upstream.mode = "stall"
    time.sleep(5)  # the stall's length is the scenario
    upstream.mode = "ok"
    upstream.released.set()
    load.wait_for(len(load.outcomes) + 10)
    audited("upstream stall 5 s", fresh, upstream, load)


@full
def test_a_worker_drains_on_sigterm(fresh, upstream):
    load = Load(fresh.urls).start()
    load.wait_for(20)
    worker = fresh.workers[0]
    restarts = worker.restarts
    worker.signal(signal.SIGTERM)  # it drains and exits; its supervisor starts it again
    eventually(lambda: worker.restarts > restarts, 60, "the drained worker to exit")
    load.wait_for(len(load.outcomes) + 20)
    audited("worker SIGTERM", fresh, upstream, load)


@full
def test_a_flood_of_jobs_meets_the_queue_bound(fresh, upstream):
    """50 clients submit 5,000 jobs as fast as each is answered: the line stops at its
    bound (429 queue_full, nothing stored), and every job accepted runs once."""
    load = Load(fresh.urls, callers=50, jobs=True, total=5000).start()
    deepest = 0
    started = time.monotonic()
    while load.thread.is_alive():  # the line's depth, sampled in the outside database
        deepest = max(deepest, waiting(fresh))
        load.thread.join(0.2)
    submitted_s = time.monotonic() - started
    found = audited("flood of 5,000 jobs", fresh, upstream, load, settle_s=180)
    statuses = Counter(o.status for o in found.outcomes)
    print(
        f"flood: {dict(statuses)} in {submitted_s:.1f} s; deepest line {deepest}"
        f" (bound {QUEUE_BOUND})"
    )
    assert statuses[429] and statuses[202]  # the bound was met, and work went on
    assert deepest <= QUEUE_BOUND * 1.5  # as operating.md says it may be overshot


@full
def test_callers_fail_fast_while_the_upstream_refuses_connections(fresh, upstream):
    """No server can serve: each caller gets 503 no_server_available (or a stream's error
    event) about SWITCHYARD_NO_SERVER_GRACE_S after it arrived, not its class's maximum
    wait; once the upstream is back, callers are served again."""
    load = Load(fresh.urls).start()
    load.wait_for(10)
    upstream.close()
    down_at = len(load.outcomes)

    def failed_fast() -> list:
        return [o for o in load.outcomes[down_at:] if o.code == "no_server_available"]

    eventually(lambda: len(failed_fast()) >= 16, 120, "callers told no_server_available")
    failed = failed_fast()
    upstream.start()
    served_again(load, len(load.outcomes))
    audited("upstream refusing, fail fast", fresh, upstream, load)
    slowest = max(o.seconds for o in failed)
    print(
        f"fail fast: {len(failed)} callers told no_server_available after"
        f" {min(o.seconds for o in failed):.2f}-{slowest:.2f} s (grace {GRACE_S:.0f} s)"
    )
    assert all(o.status == 503 or (o.stream and o.status == 200) for o in failed)
    assert slowest < GRACE_S + 10

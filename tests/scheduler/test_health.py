"""/healthz and /readyz of a web process, and a worker's own health, on real processes."""

import os

import httpx
import pytest

from tests.conftest import ServedSwitchyard, database_url, free_port
from tests.support.manage_process import ManageProcess

pytestmark = pytest.mark.django_db(transaction=True)


def web_only(**env: str) -> ServedSwitchyard:
    """A web process with no scheduler of its own."""
    process = ServedSwitchyard.__new__(ServedSwitchyard)
    process.port = free_port()
    process.url = f"http://127.0.0.1:{process.port}"
    full_env = {**os.environ, "DATABASE_URL": database_url(), "SWITCHYARD_POLL_INTERVAL_S": "1"}
    ManageProcess.__init__(
        process,
        ["serve", "--no-scheduler", "--port", str(process.port)],
        {**full_env, **env},
        lambda line: "is serving on" in line,
    )
    return process


class Worker(ManageProcess):
    def __init__(self) -> None:
        self.health_url = f"http://127.0.0.1:{free_port()}/healthz"
        port = self.health_url.split(":")[2].split("/")[0]
        env = {**os.environ, "DATABASE_URL": database_url(), "SWITCHYARD_POLL_INTERVAL_S": "0.2"}
        super().__init__(
            ["run_scheduler", "--health-port", port], env, lambda line: " started" in line
        )


def until(fact, tries: int = 200):
    """Ask again until `fact` holds: each try is a real round trip, no sleep between."""
    for _ in range(tries):
        if value := fact():
            return value
    raise AssertionError("never held")


def test_ready_only_with_a_live_worker_and_the_worker_tells_its_own_health():
    web = web_only()
    worker = None
    try:
        assert httpx.get(f"{web.url}/healthz").json() == {"status": "ok"}
        r = httpx.get(f"{web.url}/readyz")
        assert r.status_code == 503
        assert r.json()["status"] == "unavailable"
        assert [f.split(":")[0] for f in r.json()["failures"]] == ["worker"]

        worker = Worker()
        assert httpx.get(f"{web.url}/readyz").json()["status"] == "ready"
        # Healthy once its loop has ended a pass (it passes at least every poll interval).
        answer = until(lambda: (r := httpx.get(worker.health_url)).status_code == 200 and r)
        assert answer.json()["status"] == "ok"
        assert answer.json()["passes"] >= 1
        assert httpx.get(worker.health_url.replace("healthz", "x")).status_code == 404
    finally:
        web.stop()
        if worker is not None:
            worker.proc.terminate()
            worker.output(timeout=30)


def test_not_ready_without_a_database_or_a_channel_layer_but_still_alive():
    closed = free_port()  # nothing listens there
    web = web_only(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed}/none",
        REDIS_URL=f"redis://127.0.0.1:{closed}/0",
    )
    try:
        assert httpx.get(f"{web.url}/healthz").status_code == 200
        r = httpx.get(f"{web.url}/readyz", timeout=30)
        assert r.status_code == 503
        assert r.headers["Content-Type"] == "application/json"
        assert sorted(f.split(":")[0] for f in r.json()["failures"]) == [
            "channel layer",
            "database",
        ]
    finally:
        web.proc.kill()  # its pool keeps trying a database that is not there
        web.output(timeout=30)

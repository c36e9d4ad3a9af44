"""Switchyard as it runs in production, for tests against real inference servers: on
PostgreSQL with Redis, the web app (`manage.py serve --no-scheduler`) and a worker
(`manage.py run_scheduler`) in processes of their own; on the embedded default (SQLite, an
in-memory channel layer, which processes cannot share) both in one `manage.py serve`."""

import os

import httpx
from django.conf import settings

from tests.conftest import database_url, free_port
from tests.support.manage_process import ManageProcess

# Quick reactions for tests; each test may set more (`switchyard(STATUS_SYNC_S="1")`).
KNOBS = {
    "POLL_INTERVAL_S": "1",
    "DRAIN_S": "0",
    "WAITING_COMMENT_S": "0.5",
    "RETRY_BASE_S": "0.2",
    "RETRY_MAX_S": "1",
}


class Switchyard:
    def __init__(self, knobs: dict[str, str]) -> None:
        env = {**os.environ, "DATABASE_URL": database_url()}
        env |= {f"SWITCHYARD_{k}": v for k, v in (KNOBS | knobs).items()}
        self.split = settings.IS_POSTGRES and bool(os.environ.get("REDIS_URL"))
        if not self.split:
            env.pop("REDIS_URL", None)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        serve = ["serve", "--port", str(self.port)] + (["--no-scheduler"] if self.split else [])
        self.processes = [ManageProcess(serve, env, lambda line: "is serving on" in line)]
        if self.split:
            worker = ManageProcess(["run_scheduler"], env, lambda line: " started" in line)
            self.processes.append(worker)
        self.http = httpx.Client(base_url=self.url, timeout=300)  # a busy machine is slow

    def post(self, path: str, body: dict) -> httpx.Response:
        return self.http.post(path, json=body)

    def stream(self, path: str, body: dict):
        """The SSE lines of a streamed call (a context manager, as httpx's)."""
        return self.http.stream("POST", path, json={**body, "stream": True})

    def log(self) -> str:
        return "".join(line for p in self.processes for line in p.log)

    def stop(self) -> str:
        self.http.close()
        out = []
        for p in self.processes:
            p.proc.terminate()
            out.append(p.output(timeout=30))
        return "".join(out)

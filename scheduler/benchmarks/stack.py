"""The processes a benchmark runs against, on a database of their own.

PostgreSQL + Redis (when DATABASE_URL and REDIS_URL say so): daphne and `run_scheduler`
workers on a `switchyard_bench` database. Embedded default: `manage.py serve` (web and
scheduler in one process, since the in-memory channel layer is per process) on
`bench-results/bench.sqlite3`. The user's database is never touched.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import environ
from django.conf import settings
from django.db import connections

from access.models import ApiKey
from backends.models import Deployment, Model, Server
from scheduler.models import Request, Trace, Worker

BENCH = "bench"  # the database alias this process uses for the bench database
ROOT = Path(settings.BASE_DIR)
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy (harness start-up only)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every_s)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class BenchDatabase:
    """Creates, migrates and empties the bench database; registers it as alias `bench`."""

    def __init__(self, results: Path, name: str = "switchyard_bench") -> None:
        default = settings.DATABASES["default"]
        self.postgres = settings.IS_POSTGRES
        if self.postgres:
            self.name = name
            auth = default["USER"] + (f":{default['PASSWORD']}" if default["PASSWORD"] else "")
            host = f"{default['HOST'] or '127.0.0.1'}:{default['PORT'] or 5432}"
            self.url = f"postgres://{auth}@{host}/{self.name}"
            self.server = {k: default[k] for k in ("USER", "PASSWORD", "HOST", "PORT")}
        else:
            self.name = str(results / "bench.sqlite3")
            self.url = f"sqlite:///{self.name}"

    @property
    def mode(self) -> str:
        return (
            "postgres+redis"
            if self.postgres and settings.REDIS_URL
            else ("postgres" if self.postgres else "embedded sqlite")
        )

    def create(self) -> None:
        if self.postgres:
            import psycopg

            params = {
                "dbname": "postgres",
                "user": self.server["USER"] or None,
                "password": self.server["PASSWORD"] or None,
                "host": self.server["HOST"] or "127.0.0.1",
                "port": self.server["PORT"] or 5432,
            }
            with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
                c.execute(f"CREATE DATABASE {self.name}")
        else:
            Path(self.name).parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-wal", "-shm"):
                Path(self.name + suffix).unlink(missing_ok=True)
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--verbosity", "0"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": self.url},
            check=True,
        )
        self.create_api_key()
        config = environ.Env.db_url_config(self.url)
        if not self.postgres:
            config["OPTIONS"] = settings.DATABASES["default"]["OPTIONS"]
        configured = connections.configure_settings(
            {"default": settings.DATABASES["default"], BENCH: config}
        )
        connections.settings[BENCH] = configured[BENCH]

    def create_api_key(self, name: str = "bench", *options: str) -> str:
        """A key made as an operator makes one; the first is the load generator's default
        (SWITCHYARD_API_KEY in its environment): the bench measures with a key checked."""
        made = subprocess.run(
            [PYTHON, "manage.py", "create_api_key", name, *options],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": self.url},
            check=True,
            capture_output=True,
            text=True,
        )
        secret = made.stdout.strip().splitlines()[-1]
        if name == "bench":
            os.environ["SWITCHYARD_API_KEY"] = secret
        return secret

    def api_key_id(self, secret: str) -> int:
        prefix = secret.removeprefix("sy-").split(".", 1)[0]
        return ApiKey.objects.using(BENCH).get(prefix=prefix).pk

    def empty(self) -> None:
        tables = [m._meta.db_table for m in (Trace, Request, Deployment, Model, Server, Worker)]
        with connections[BENCH].cursor() as cursor:
            if self.postgres:
                cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
            else:
                for table in tables:
                    cursor.execute(f"DELETE FROM {table}")

    def close(self) -> None:
        connections[BENCH].close()


def peak_rss_mb(pid: int) -> float | None:
    """The process's high-water resident set (VmHWM), in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _stat(path: Path) -> tuple[str, list[str]] | None:
    """A process's name and the fields after it in its /proc stat (None once it is gone)."""
    try:
        name, rest = path.read_text().split(" (", 1)[1].rsplit(") ", 1)
    except (OSError, ValueError):
        return None
    return name, rest.split()


def cpu_s(pid: int) -> float | None:
    """User plus system CPU time the process has used so far, in seconds."""
    stat = _stat(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return None
    return sum(int(f) for f in stat[1][11:13]) / os.sysconf("SC_CLK_TCK")  # utime stime


def service_cpu_s(command: str) -> float:
    """CPU seconds used so far by every process named `command`, with the children they
    reaped: a PostgreSQL backend that exited counts in its postmaster's."""
    stats = filter(None, map(_stat, Path("/proc").glob("[0-9]*/stat")))
    ticks = sum(
        sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        for name, fields in stats
        if name == command
    )
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Stack:
    """Upstream, web and worker processes for one scenario; their logs in `logs`."""

    db: BenchDatabase
    scenario: str
    logs: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: int = 1
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    base_url: str = ""

    def child_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.db.url,
            "DEBUG": "False",  # production-like: no query log kept in memory
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(40),
            "SWITCHYARD_POLL_INTERVAL_S": "1",
            "SWITCHYARD_MAX_QUEUE": "10000000",
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }

    def log_path(self, name: str) -> Path:
        path = self.logs / f"{self.scenario}-{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.log_path(name).open("w")
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.child_env(), stdout=log, stderr=subprocess.STDOUT
        )
        self.procs[name] = proc
        return proc

    def log_text(self, name: str) -> str:
        return self.log_path(name).read_text()

    def start_upstream(self, models: list[str]) -> str:
        argv = [PYTHON, "-m", "scheduler.benchmarks.upstream", "--models", ",".join(models)]
        self.spawn("upstream", argv)
        line = wait_until(
            lambda: "listening on" in self.log_text("upstream") and self.log_text("upstream"),
            15,
            "the upstream",
        )
        return f"http://127.0.0.1:{line.split('listening on')[1].split()[0]}"

    def start_switchyard(self) -> str:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        if self.db.mode == "postgres+redis":
            web = [PYTHON, "-m", "config.web", "-b", "127.0.0.1", "-p", str(port)]
            self.spawn("web", [*web, "config.asgi:application"])
            for i in range(self.workers):
                self.spawn(f"worker-{i + 1}", [PYTHON, "manage.py", "run_scheduler"])
            wait_until(self.web_answers, 30, "daphne")
            wait_until(
                lambda: Worker.objects.using(BENCH).count() >= self.workers, 30, "the workers"
            )
        else:
            self.spawn("web", [PYTHON, "manage.py", "serve", "--port", str(port)])
            wait_until(lambda: "is serving on" in self.log_text("web"), 30, "manage.py serve")
            wait_until(lambda: Worker.objects.using(BENCH).exists(), 30, "the scheduler")
        return self.base_url

    def web_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", int(self.base_url.rsplit(":", 1)[1]))):
                return True
        except OSError:
            return False

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def switchyard_pids(self) -> dict[str, int]:
        names = [n for n in self.procs if n == "web" or n.startswith("worker")]
        return {n: self.procs[n].pid for n in names}

    def peak_rss(self) -> dict[str, float | None]:
        """Peak RSS of the web and worker processes (one process when embedded)."""
        peaks = {name: peak_rss_mb(pid) for name, pid in self.switchyard_pids().items()}
        if self.db.mode != "postgres+redis" and "web" in peaks:
            peaks = {"serve (web+worker)": peaks["web"]}
        return peaks

    def cpu(self) -> dict[str, float | None]:
        """CPU seconds used so far by the web and worker processes, and by PostgreSQL and
        Redis when they serve (every process of theirs on this host: nothing else here
        uses them during a run)."""
        used = {name: cpu_s(pid) for name, pid in self.switchyard_pids().items()}
        if self.db.mode == "postgres+redis":
            used |= {"postgres": service_cpu_s("postgres"), "redis": service_cpu_s("redis-server")}
        return used

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def run_loadgen(*phases: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the load generator in its own process; what it measured, phase by phase."""
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "results.json"
        done = subprocess.run(
            [PYTHON, "-m", "scheduler.benchmarks.loadgen", str(results)],
            cwd=ROOT,
            input=json.dumps(list(phases)),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the load generator failed:\n{done.stderr[-3000:]}")
        return json.loads(results.read_text())

"""Switchyard as in production, on services of its own that a test may break: a private
PostgreSQL cluster (initdb in a temporary folder, a free port), a private Redis, two web
processes, two workers and an upstream server that can be faulted. Never the shared
PostgreSQL or Redis."""

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from tests.conftest import free_port
from tests.support.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
PG_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
PG_BIN = PG_BINS[-1] if PG_BINS else ""
KNOBS = {
    "SWITCHYARD_POLL_INTERVAL_S": "1",
    "SWITCHYARD_WAITING_COMMENT_S": "2",
    "SWITCHYARD_RETRY_BASE_S": "0.2",
    "SWITCHYARD_RETRY_MAX_S": "1",
    "SWITCHYARD_DRAIN_S": "5",
    "SWITCHYARD_MAX_QUEUE": "400",  # the flood meets it; eight callers never do
    "SWITCHYARD_NO_SERVER_GRACE_S": "5",
    "SWITCHYARD_BREAKER_COOLDOWN_S": "2",  # a faulted upstream is probed back within seconds
    "SWITCHYARD_AUTH": "off",
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}


def as_postgres(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """PostgreSQL's tools refuse to run as root."""
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


class PrivatePostgres:
    def __init__(self, folder: Path) -> None:
        self.folder = folder / "pg"
        self.folder.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.port = free_port()
        as_postgres([f"{PG_BIN}/initdb", "-D", str(self.folder), "-U", "postgres", "-A", "trust"])
        self.start()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/switchyard"
        with self.admin() as c:
            c.execute("CREATE DATABASE switchyard")

    def pg_ctl(self, *args: str) -> None:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=200"
        )
        log = str(self.folder / "server.log")
        as_postgres([f"{PG_BIN}/pg_ctl", "-D", str(self.folder), "-l", log, "-o", options, *args])

    def start(self) -> None:
        self.pg_ctl("-w", "start")

    def stop(self) -> None:
        self.pg_ctl("-w", "-m", "fast", "stop")

    def admin(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True
        )

    def query(self, sql: str, params=()) -> list[tuple]:
        with self.admin("switchyard") as c:
            cursor = c.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def terminate_backends(self) -> int:
        """End every session on the Switchyard database, as an operator or a failover does."""
        rows = self.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = 'switchyard' AND pid <> pg_backend_pid()"
        )
        return len(rows)


class PrivateRedis:
    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.folder)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        eventually(self.answers, 10, "redis-server")

    def answers(self) -> bool:
        done = subprocess.run(
            ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
        )
        return done.stdout.strip() == "PONG"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


class Process:
    """A project program in a process of its own, its output in a file (never a pipe that
    fills up and stops it)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], folder: Path) -> None:
        self.name, self.args, self.env = name, args, env
        self.log_path = folder / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.supervised = False

    def supervise(self, ready: str) -> None:
        """Start it again whenever it exits by itself, as systemd's Restart=always does (a
        worker that loses the database exits, and is restarted)."""
        self.supervised = True

        def watch() -> None:
            while self.supervised:
                proc = self.proc
                if proc is not None and proc.poll() is not None and self.supervised:
                    self.restarts += 1
                    with contextlib.suppress(AssertionError):
                        self.start(ready)
                time.sleep(0.1)

        threading.Thread(target=watch, daemon=True).start()

    def start(self, ready: str) -> None:
        mode = "a" if self.log_path.exists() else "w"
        with self.log_path.open(mode) as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        seen = len(self.log().splitlines()) if mode == "a" else 0
        eventually(lambda: ready in "\n".join(self.log().splitlines()[seen:]), 60, f"{self.name}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop_supervising(self) -> None:
        self.supervised = False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Cluster:
    def __init__(self, upstream_url: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="switchyard-faults-"))
        os.chmod(self.folder, 0o755)
        self.pg = PrivatePostgres(self.folder)
        self.redis = PrivateRedis(self.folder)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
        self.env = env | KNOBS | {"DATABASE_URL": self.pg.url, "REDIS_URL": self.redis.url}
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=self.env, check=True)
        setup = (
            "from tests import factories;"
            f"s = factories.server('up', kind='openai', base_url='{upstream_url}', slots=8);"
            "factories.deployment(s, 'm1', server_model_id='m1-up', state='loaded')"
        )
        subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=self.env, check=True)
        self.ports = [free_port(), free_port()]
        self.webs = [
            Process(
                f"web-{i + 1}", ["serve", "--no-scheduler", "--port", str(p)], self.env, self.folder
            )
            for i, p in enumerate(self.ports)
        ]
        self.workers = [
            Process(f"worker-{i + 1}", ["run_scheduler"], self.env, self.folder) for i in range(2)
        ]
        for web in self.webs:
            web.start("is serving on")
        for worker in self.workers:
            worker.start(" started")
            worker.supervise(" started")

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def logs(self) -> dict[str, str]:
        return {p.name: p.log() for p in [*self.webs, *self.workers]}

    def close(self) -> None:
        for p in self.workers:
            p.stop_supervising()
        for p in [*self.webs, *self.workers]:
            p.signal(signal.SIGTERM)
        for p in [*self.webs, *self.workers]:
            p.wait()
        self.redis.stop()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.pg.stop()
        kept = Path(tempfile.gettempdir()) / "switchyard-faults-logs"  # for a post-mortem
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir()
        for log in self.folder.glob("*.log"):
            shutil.copy(log, kept)
        shutil.copy(self.pg.folder / "server.log", kept / "postgresql.log")
        shutil.rmtree(self.folder, ignore_errors=True)

"""py-spy while a scenario runs: collapsed stacks per process and where the samples fall."""

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

# Frames that mark a layer of the request's path, first match wins (most specific first).
LAYERS = (
    ("policy.plan", "scheduler/policy.py"),
    ("snapshot read", "SnapshotReader.read"),
    ("transitions (move)", "scheduler/transitions.py"),
    ("store (dispatch/complete)", "scheduler/store/"),
    ("intake (accept)", "scheduler/api/intake.py"),
    ("channel layer (redis)", "channels_redis"),
    ("channel layer (in-memory)", "channels/layers.py"),
    ("adapter HTTP (httpx)", "httpx"),
    ("waiting on PostgreSQL", "Connection.wait (psycopg"),
    ("DB driver (psycopg)", "psycopg"),
    ("DB driver (sqlite)", "sqlite3"),
    ("Django ORM", "django/db"),
    ("Django request handling", "django/core/handlers"),
    ("daphne / twisted", "twisted"),
    ("asgiref thread hop", "asgiref"),
    ("asyncio loop", "asyncio"),
)


# Functions whose inclusive share tells where a request's time goes.
INCLUSIVE = (
    "SnapshotReader.read",
    "plan (",
    "move (",
    "dispatch (",
    "requests_completed",
    "accept (",
    "until_finished",
    "relay",
    "ServerTasks.serve",
    "serve (",
    "heartbeat",
    "group_send",
    "new_channel",
    "group_add",
    "group_discard",
    "QueueBound.admit",
    "request_moved",
)


# Leaves that mean a thread is parked, not working: left out of every share.
IDLE = (
    "select (selectors.py",
    "Condition.wait (threading.py",
    "_worker (concurrent/futures/thread.py",
    "Event.wait (threading.py",
)


class Profiler:
    """One `py-spy record --format raw` per process, stopped with SIGINT when done."""

    def __init__(self, pids: dict[str, int], results: Path, scenario: str) -> None:
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        for name, pid in pids.items():
            out = results / f"profile-{scenario}-{name}.txt"
            argv = [spy, "record", "--format", "raw", "--rate", "250", "-o", str(out)]
            argv += ["--pid", str(pid)]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs[name] = (proc, out)

    def stop(self) -> dict[str, Any]:
        summary = {}
        for name, (proc, out) in self.procs.items():
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            if out.exists():
                summary[name] = summarize(out.read_text())
        return summary


def summarize(collapsed: str, top: int = 12) -> dict[str, Any]:
    """Share of busy samples per layer (by the innermost matching frame), the hottest
    functions by self time, and the inclusive share of the functions on a request's path."""
    layers: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if any(marker in frames[-1] for marker in IDLE):
            continue
        total += n
        leaves[frames[-1]] += n
        layers[_layer(frames)] += n
        for name in INCLUSIVE:
            if any(name in f for f in frames):
                inclusive[name.strip(" (")] += n
    share = lambda c: round(100 * c / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "layers_pct": {k: share(v) for k, v in layers.most_common()},
        "hottest_pct": {k: share(v) for k, v in leaves.most_common(top)},
        "inclusive_pct": {k: share(v) for k, v in inclusive.most_common()},
    }


def _layer(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, marker in LAYERS:
            if marker in frame:
                return name
    return "other"

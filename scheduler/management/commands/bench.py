"""`manage.py bench [SCENARIO ...] [--quick]`: end-to-end benchmarks on a database of their
own; tables on stdout, JSON and PNG charts under bench-results/."""

import datetime
import os
import platform
import subprocess
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config import event_loop
from scheduler.benchmarks import report
from scheduler.benchmarks.context import Context
from scheduler.benchmarks.scenarios import SCENARIOS
from scheduler.benchmarks.stack import BenchDatabase


class Command(BaseCommand):
    help = "Benchmark Switchyard end to end: " + ", ".join(SCENARIOS)

    def add_arguments(self, parser) -> None:
        parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: all")
        parser.add_argument("--quick", action="store_true", help="small scale, well under 1 min")
        parser.add_argument("--workers", type=int, default=1, help="run_scheduler processes")
        parser.add_argument("--profile", action="store_true", help="py-spy during `overhead`")
        parser.add_argument("--results", default=str(Path(settings.BASE_DIR) / "bench-results"))
        parser.add_argument(
            "--db-name",
            default="switchyard_bench",
            help="PostgreSQL database the bench creates (dropped first); SQLite uses a file "
            "in the results directory",
        )

    def handle(self, *args, scenarios, quick, workers, profile, results, db_name, **options):
        unknown = set(scenarios) - set(SCENARIOS)
        if unknown:
            raise CommandError(f"unknown scenarios {sorted(unknown)}; pick from {list(SCENARIOS)}")
        results_dir = Path(results)
        results_dir.mkdir(parents=True, exist_ok=True)
        db = BenchDatabase(results_dir, db_name)
        db.create()
        logs = results_dir / "logs" / time.strftime("%Y%m%d-%H%M%S")
        ctx = Context(db, results_dir, logs, quick, workers, profile)
        scale = "quick" if quick else "full"
        self.stdout.write(f"bench database: {db.url} ({db.mode}); results in {results_dir}/")
        self.stdout.write(f"process logs in {logs}/")
        try:
            for name in scenarios or list(SCENARIOS):
                began, load_before = time.monotonic(), os.getloadavg()[0]
                outcome = SCENARIOS[name](ctx)
                meta = {
                    **run_facts(),
                    "scale": scale,
                    "mode": db.mode,
                    "event_loop": event_loop.chosen(),  # the processes inherit the choice
                    "workers": workers if db.mode == "postgres+redis" else 1,
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "wall_s": round(time.monotonic() - began, 1),
                    # Other work on the host skews every number; this says how much there was.
                    "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                    **ctx.meta,
                }
                paths = report.write(outcome, meta, results_dir)
                self.stdout.write("\n" + report.render(outcome, meta))
                chart = paths["png"] or "(no chart: pip install matplotlib)"
                self.stdout.write(f"→ {paths['json']}  {chart}\n")
        finally:
            db.close()


def run_facts() -> dict[str, str | None]:
    """When, on what and of which code a result was taken: a result file stands alone."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "cpu_model": _cpu_model(),
    }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

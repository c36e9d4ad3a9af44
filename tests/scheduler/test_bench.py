"""Smoke test of `manage.py bench --quick`: the harness starts its processes, measures and
writes its results. It asserts the shape of what is written, never the numbers."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

from config import event_loop
from tests.support.manage_process import ROOT


@pytest.fixture
def bench_db_name():
    """A PostgreSQL bench database of this test's own, dropped afterwards."""
    name = f"switchyard_bench_test_{os.getpid()}"
    yield name
    if settings.IS_POSTGRES:
        import psycopg

        db = settings.DATABASES["default"]
        params = {"dbname": "postgres", "user": db["USER"], "password": db["PASSWORD"]}
        params |= {"host": db["HOST"] or "127.0.0.1", "port": db["PORT"] or 5432}
        with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_quick_dispatch_writes_a_table_json_and_chart(tmp_path, bench_db_name):
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", "dispatch", "--quick"]
        + ["--results", str(tmp_path), "--db-name", bench_db_name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "## dispatch (quick" in done.stdout

    result = json.loads((tmp_path / "dispatch.json").read_text())
    assert result["scenario"] == "dispatch"
    assert result["scale"] == "quick"
    assert result["mode"] in ("embedded sqlite", "postgres+redis", "postgres")
    assert result["event_loop"] == event_loop.chosen()  # as its processes inherit it
    assert result["date"].endswith("+00:00") and result["cpu_model"]
    assert result["commit"] and isinstance(result["dirty"], bool)  # the code it measured
    columns, rows = result["table"]["columns"], result["table"]["rows"]
    assert columns[0] == "run" and [r[0] for r in rows] == ["c=1", "c=8"]
    assert all(len(r) == len(columns) for r in rows)
    assert {t["name"] for t in result["targets"]} == {
        "commit→send p50, c=1",
        "commit→send p99, c=1",
    }
    assert all(set(t) == {"name", "value", "target", "met"} for t in result["targets"])
    assert result["peak_rss_mb"] and all(v > 0 for v in result["peak_rss_mb"].values())
    assert (tmp_path / "logs").is_dir()
    try:
        import matplotlib  # noqa: F401  (the `bench` extra)
    except ImportError:
        return
    assert (tmp_path / "dispatch.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.django_db
def test_the_machine_yardstick_times_round_trips_to_each_service_in_use(tmp_path):
    from django.db import connection

    from scheduler.benchmarks.machine import round_trips
    from scheduler.benchmarks.stack import BenchDatabase

    found = round_trips(BenchDatabase(tmp_path, name=connection.settings_dict["NAME"]), count=5)

    expected = set()
    if settings.IS_POSTGRES:
        expected |= {"postgres idle", "postgres back to back"}
    if settings.REDIS_URL:
        expected.add("redis idle")
    assert set(found) == expected
    assert all(ms > 0 for ms in found.values())


def test_a_latency_in_idle_round_trips_is_counted_in_the_yardstick_of_its_run():
    from scheduler.benchmarks.machine import in_idle_round_trips

    assert in_idle_round_trips(6.0, {"postgres idle": 0.1, "redis idle": 0.05}) == 60
    assert in_idle_round_trips(3.7, {"postgres idle": 0.062}) == 60
    assert in_idle_round_trips(6.0, {"redis idle": 0.05}) is None  # no PostgreSQL in the run
    assert in_idle_round_trips(None, {"postgres idle": 0.1}) is None

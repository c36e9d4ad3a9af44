"""`simulate --history HOURS`: this installation's servers, models and past requests as a
trace, what the rows cannot say filled in and counted (scheduler/simulation_history.py)."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from scheduler.models import Priority, State
from scheduler.simulation_history import DEFAULT_LOAD_S, DEFAULT_RUN_S, trace_from_history
from scheduler.simulation_workload import (
    ModelSpec,
    ServerSpec,
    WorkloadRequest,
    read_workload,
)
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def past_hour():
    """gpu-a serves qwen (loads measured at 12 and 18 s), embed and coder (never loaded;
    coder's size known); gpu-b serves qwen too; the disabled gpu-off alone serves old. An
    hour of requests."""
    now = timezone.now()
    a = factories.server("gpu-a", slots=2, max_llm=2, max_models=2, memory_mb=24_000)
    b = factories.server("gpu-b")
    off = factories.server("gpu-off", enabled=False)
    factories.deployment(a, "qwen", avg_load_s=12.0, size_mb=5_000)
    factories.deployment(b, "qwen", avg_load_s=18.0, size_mb=6_000)
    factories.model("embed", type="embedding")
    factories.deployment(a, "embed")
    factories.deployment(a, "coder", size_mb=2_500)
    factories.deployment(off, "old")

    def at(minutes: float):
        return now - timedelta(minutes=60 - minutes)

    def ran(model: str, minute: float, seconds: float, **fields):
        started = at(minute) + timedelta(seconds=2)
        return factories.request(
            model,
            state=State.COMPLETED,
            created_at=at(minute),
            started_at=started,
            finished_at=started + timedelta(seconds=seconds),
            **fields,
        )

    ran("qwen", 1, 4.0, priority=Priority.INTERACTIVE)
    ran("qwen", 2, 6.0)
    ran("qwen", 3, 20.0)
    factories.request("qwen", state=State.EXPIRED, created_at=at(10), finished_at=at(12))
    factories.request("embed", Priority.BACKGROUND, state=State.PENDING, created_at=at(30))
    factories.request("old", state=State.FAILED, created_at=at(40), finished_at=at(40))
    factories.request("qwen", created_at=now - timedelta(hours=2))  # before the window
    return now


def test_the_trace_is_the_servers_models_and_requests_of_the_window(past_hour, settings):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "MAX_WAIT_INTERACTIVE_S": 90.0}
    since = past_hour - timedelta(hours=1)
    found = trace_from_history(since, past_hour)
    trace = found.trace

    assert trace.start == since
    assert trace.servers == (
        ServerSpec(
            "gpu-a",
            slots=2,
            memory_mb=24_000,
            capacity={"llm": 2, "embedding": 1, "reranking": 1},
            max_models=2,
        ),
        ServerSpec("gpu-b", capacity={"llm": 1, "embedding": 1, "reranking": 1}),
    )
    # The mean of the measured loads, the largest size; one never measured its size at its
    # server's speed (gpu-a read 5 GB in 12 s: 2.5 GB in 6 s), else the default.
    assert trace.models == (
        ModelSpec("coder", 6.0, ("gpu-a",), size_mb=2_500),
        ModelSpec("embed", DEFAULT_LOAD_S, ("gpu-a",), type="embedding"),
        ModelSpec("qwen", 15.0, ("gpu-a", "gpu-b"), size_mb=6_000),
    )
    assert trace.requests == (
        WorkloadRequest(60.0, "qwen", Priority.INTERACTIVE, 4.0),
        WorkloadRequest(120.0, "qwen", Priority.NORMAL, 6.0),
        WorkloadRequest(180.0, "qwen", Priority.NORMAL, 20.0),
        WorkloadRequest(600.0, "qwen", Priority.NORMAL, 6.0),  # expired: qwen's median run
        WorkloadRequest(1800.0, "embed", Priority.BACKGROUND, DEFAULT_RUN_S),  # none ran
    )
    assert found.left_out == 1  # `old`: only the disabled server has it
    assert found.gaps == {
        "load time: its operator's figure or its size at its servers' speed": 1,
        "load time: the default": 1,
        "run time: the model's median": 1,
        "run time: the default": 1,
    }
    assert trace.max_wait_s[Priority.INTERACTIVE] == 90.0  # the installation's own


def test_simulate_replays_the_history_and_saves_it(past_hour, tmp_path):
    out = StringIO()
    saved = tmp_path / "history.json"
    call_command("simulate", "--history", "1", "--write-trace", str(saved), stdout=out)
    printed = out.getvalue()
    assert (
        "Filled in where the rows say nothing: load time: its operator's figure or its size"
        " at its servers' speed (1);" in printed
    )
    assert "Left out: 1 requests for models no enabled server serves" in printed
    assert "5 requests (this installation's last 1 hours), 2 servers, 3 models" in printed
    assert "interactive wait p95" in printed and "met   lost: 0" in printed
    assert len(read_workload(saved).requests) == 5


def test_simulate_history_says_what_is_wrong(past_hour, tmp_path):
    with pytest.raises(CommandError, match="positive number of hours"):
        call_command("simulate", "--history", "0")
    with pytest.raises(CommandError, match="no requests in the last 0.01 hours"):
        call_command("simulate", "--history", "0.01")
    with pytest.raises(CommandError, match="not both"):
        call_command("simulate", str(tmp_path / "day.json"), "--history", "1")

"""The policy on a virtual clock against a serial FIFO: proof by simulation. No database."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from scheduler.simulation import simulate_fifo, simulate_policy
from scheduler.simulation_mixed_day import generate_mixed_day
from scheduler.simulation_swap import simulate_self_swapping
from scheduler.simulation_targets import targets
from scheduler.simulation_workload import (
    BACKGROUND,
    INTERACTIVE,
    NORMAL,
    ModelSpec,
    ServerSpec,
    Workload,
    WorkloadError,
    WorkloadRequest,
    generate_day,
    jittered,
    read_workload,
    window,
    write_workload,
)

pytestmark = pytest.mark.xdist_group("simulation")  # its days are simulated once, on one worker


@pytest.fixture(scope="module")
def day():
    trace = generate_day(seed=0)
    return trace, simulate_policy(trace), simulate_fifo(trace)


def two_servers(*requests: WorkloadRequest, **fields) -> Workload:
    """s1 holds only `big` (90 s to load), s2 only `small` (3 s)."""
    return Workload(
        servers=(ServerSpec("s1"), ServerSpec("s2")),
        models=(ModelSpec("big", 90, ("s1",)), ModelSpec("small", 3, ("s2",))),
        requests=requests,
        **fields,
    )


def test_default_day_has_the_issue_scenario(day):
    trace, _, _ = day
    load_times = sorted(m.load_s for m in trace.models)
    assert len(trace.servers) == 3 and len(trace.models) == 8
    assert load_times[0] == 3 and load_times[-1] == 90
    assert {r.priority for r in trace.requests} == {0, 1, 2, 3}
    assert max(r.at for r in trace.requests) > 23 * 3600


def test_policy_waits_less_for_interactive_and_loses_nothing(day):
    _, policy, fifo = day
    assert policy.wait_percentile(INTERACTIVE, 95) < fifo.wait_percentile(INTERACTIVE, 95)
    assert policy.count("expired") < fifo.count("expired")
    assert policy.lost == 0 and fifo.lost == 0
    assert policy.dropped == 0  # a single executor never loses a compare-and-set race


def test_policy_loads_less_than_fifo(day):
    """For requests: the restores on idle (`housekeeping.restore`) are loads nobody asked for,
    counted apart (and in issue 34's load target)."""
    _, policy, fifo = day
    assert 0 < policy.restores < policy.loads
    assert policy.loads - policy.restores < fifo.loads


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_policy_beats_fifo_on_other_days(seed):
    """Not tuned to one day: breaks if the policy only beat FIFO on seed 0."""
    trace = generate_day(seed)
    policy, fifo = simulate_policy(trace), simulate_fifo(trace)
    assert policy.wait_percentile(INTERACTIVE, 95) < fifo.wait_percentile(INTERACTIVE, 95)
    assert policy.lost == 0


# -- issue 34's targets against self-swapping servers ----------------------------------------

DAYS = {
    **{f"default day, seed {seed}": (generate_day, seed) for seed in range(4)},
    "mixed day, seed 0": (generate_mixed_day, 0),
}
# Targets the policy does not meet yet, by day (strict: meeting one fails the test, so the
# list shrinks as the policy improves). See `manage.py simulate` for the numbers.
NOT_YET = {
    ("default day, seed 1", "background p95"),
    ("default day, seed 2", "background p95"),
    ("default day, seed 3", "background p95"),
    ("default day, seed 3", "expired that the baseline served"),
}
TARGET_NAMES = [
    "interactive p95",
    "high p95",
    "normal p95",
    "background p95",
    "loads",
    "expired that the baseline served",
    "lost",
]


@pytest.fixture(scope="module")
def against_self_swapping():
    found = {}
    for day, (generate, seed) in DAYS.items():
        trace = generate(seed)
        for t in targets(simulate_policy(trace), simulate_self_swapping(trace)):
            found[day, t.name] = t
    return found


@pytest.mark.parametrize("day", list(DAYS))
@pytest.mark.parametrize("name", TARGET_NAMES)
def test_target_against_self_swapping(day, name, against_self_swapping, request):
    if (day, name) in NOT_YET:
        request.applymarker(pytest.mark.xfail(strict=True, reason="not met yet (issue 34)"))
    target = against_self_swapping[day, name]
    assert target.met, target.detail


def test_self_swapping_loads_whatever_arrives_and_evicts_the_least_recently_used():
    """One server holding one model: A, B, A each evict the other (three loads), and a
    request for a model it is loading waits for that load instead of starting another."""
    trace = Workload(
        servers=(ServerSpec("s1"),),
        models=(ModelSpec("a", 10, ("s1",)), ModelSpec("b", 5, ("s1",))),
        requests=(
            WorkloadRequest(0, "a", NORMAL, 1),
            WorkloadRequest(1, "a", NORMAL, 1),
            WorkloadRequest(20, "b", NORMAL, 1),
            WorkloadRequest(40, "a", NORMAL, 1),
        ),
    )
    result = simulate_self_swapping(trace)
    assert result.loads == 3
    assert [result.outcomes[i].wait_s for i in range(4)] == [10, 10, 7, 12]


@pytest.mark.parametrize("simulate", [simulate_policy, simulate_fifo, simulate_self_swapping])
def test_a_count_in_all_makes_a_model_of_another_type_leave(simulate):
    """A router at --models-max 1 (`max_models`) with an LLM and an embedding model: each
    switch between them is a load (four), in all three; each type's own room would keep
    both (two loads)."""

    def trace(max_models):
        return Workload(
            servers=(ServerSpec("s1", capacity={"llm": 1, "embedding": 1}, max_models=max_models),),
            models=(ModelSpec("a", 10, ("s1",)), ModelSpec("e", 2, ("s1",), type="embedding")),
            requests=tuple(
                WorkloadRequest(at, model, NORMAL, 1)
                for at, model in ((0, "a"), (30, "e"), (60, "a"), (90, "e"))
            ),
        )

    assert simulate(trace(None)).loads == 2
    one_in_all = simulate(trace(1))
    assert (one_in_all.loads, one_in_all.lost, one_in_all.count("completed")) == (4, 0, 4)


def test_self_swapping_sends_to_the_least_busy_home_and_loads_in_parallel():
    """Two servers list `a`: the second request goes to the idle one, which loads `a` at
    the same time as the first (no serial loads across servers)."""
    trace = Workload(
        servers=(ServerSpec("s1"), ServerSpec("s2")),
        models=(ModelSpec("a", 10, ("s1", "s2")),),
        requests=(WorkloadRequest(0, "a", NORMAL, 30), WorkloadRequest(0, "a", NORMAL, 30)),
    )
    result = simulate_self_swapping(trace)
    assert result.loads == 2
    assert [result.outcomes[i].wait_s for i in range(2)] == [10, 10]


def test_a_slow_load_does_not_hold_up_a_loaded_model():
    """Breaks if a 90 s load on s1 delays `small` on s2, as the serial baseline does."""
    trace = two_servers(
        WorkloadRequest(0, "small", INTERACTIVE, 1),
        WorkloadRequest(10, "big", NORMAL, 5),
        WorkloadRequest(20, "small", INTERACTIVE, 1),
    )
    policy, fifo = simulate_policy(trace), simulate_fifo(trace)
    assert [policy.outcomes[i].wait_s for i in range(3)] == [3, 90, 0]
    assert [fifo.outcomes[i].wait_s for i in range(3)] == [3, 90, 85]
    assert policy.loads == fifo.loads == 2
    assert policy.count("completed") == 3


def test_a_request_expires_at_its_max_wait_and_is_not_lost():
    trace = two_servers(WorkloadRequest(0, "big", INTERACTIVE, 1), max_wait_s={INTERACTIVE: 60})
    result = simulate_policy(trace)
    assert result.outcomes[0].state == "expired" and result.outcomes[0].wait_s == 60
    assert result.lost == 0 and result.loads == 1


def test_a_load_nobody_waits_for_gives_way():
    """`big`'s only request expires 60 s into its 90 s load; `small` needs s1 at 61 s: the
    load is stopped (2 s to unload), its pending end dropped, and `small` waits 5 s instead
    of 34 s (the rest of the load, then an eviction). Breaks if a stopped load still
    finished, or if `small` waited for it."""
    trace = Workload(
        servers=(ServerSpec("s1"),),
        models=(ModelSpec("big", 90, ("s1",)), ModelSpec("small", 3, ("s1",))),
        requests=(
            WorkloadRequest(0, "big", INTERACTIVE, 1),
            WorkloadRequest(61, "small", NORMAL, 1),
        ),
        max_wait_s={INTERACTIVE: 60, NORMAL: 600},
    )
    result = simulate_policy(trace)
    assert [result.outcomes[i].state for i in range(2)] == ["expired", "completed"]
    assert result.outcomes[1].wait_s == 5
    assert (result.stopped, result.loads, result.lost) == (1, 1, 0)


def test_fifo_expires_what_the_worker_reaches_too_late():
    trace = two_servers(
        WorkloadRequest(0, "big", BACKGROUND, 100),
        WorkloadRequest(1, "small", INTERACTIVE, 1),
        max_wait_s={INTERACTIVE: 120, BACKGROUND: 3600},
    )
    fifo = simulate_fifo(trace)
    assert fifo.outcomes[1].state == "expired" and fifo.outcomes[1].wait_s == 120
    assert simulate_policy(trace).outcomes[1].wait_s == 3  # s2 loads `small` meanwhile


def test_same_seed_same_day_same_result():
    first, again, other = generate_day(7, hours=3), generate_day(7, hours=3), generate_day(8, 3)
    assert first == again and first.requests != other.requests
    a, b = simulate_policy(first), simulate_policy(again)
    assert (a.outcomes, a.loads, a.passes) == (b.outcomes, b.loads, b.passes)
    assert simulate_fifo(first).outcomes == simulate_fifo(again).outcomes


def test_a_window_keeps_its_requests_counted_from_its_start():
    day = generate_day(7, hours=3)
    hour = window(day, 3600, 7200)
    inside = [r for r in day.requests if 3600 <= r.at < 7200]
    assert [r.at + 3600 for r in hour.requests] == [r.at for r in inside]
    assert hour.requests and all(0 <= r.at < 3600 for r in hour.requests)
    assert (hour.servers, hour.models, hour.start) == (day.servers, day.models, day.start)


def test_jitter_moves_each_request_within_its_bounds_the_same_for_a_seed():
    # Arrivals 100 s apart: moved by at most 15 s, they keep their order.
    trace = two_servers(*(WorkloadRequest(100.0 * i, "small", i % 4, 1.0 + i) for i in range(40)))
    shaken = jittered(trace, seed=1, arrival_s=15, duration_share=0.1)
    assert shaken == jittered(trace, seed=1) and shaken != jittered(trace, seed=2)
    pairs = list(zip(trace.requests, shaken.requests, strict=True))
    for before, after in pairs:
        assert (after.model, after.priority) == (before.model, before.priority)
        assert after.at >= 0 and abs(after.at - before.at) <= 15
        assert 0.9 * before.duration_s <= after.duration_s <= 1.1 * before.duration_s
    assert all(after.at != before.at for before, after in pairs[1:])
    assert shaken.requests[0].at < 15  # the first, at 0, moves only later


def test_trace_file_round_trip(tmp_path):
    trace = generate_day(3, hours=1)
    write_workload(trace, tmp_path / "day.json")
    assert read_workload(tmp_path / "day.json") == trace


def test_trace_with_unknown_model_is_rejected(tmp_path):
    path = tmp_path / "bad.json"
    data = {
        "servers": [{"name": "s1"}],
        "models": [{"name": "a", "load_s": 3, "servers": ["s1"]}],
        "requests": [{"at": 0, "model": "b", "priority": 0, "duration_s": 1}],
    }
    path.write_text(json.dumps(data))
    with pytest.raises(WorkloadError, match="unknown model b"):
        read_workload(path)
    with pytest.raises(CommandError, match="unknown model b"):
        call_command("simulate", str(path))


def test_command_prints_the_table_for_a_trace_file(tmp_path):
    path = tmp_path / "t.json"
    write_workload(two_servers(WorkloadRequest(0, "small", INTERACTIVE, 1)), path)
    out = StringIO()
    call_command("simulate", str(path), stdout=out)
    lines = out.getvalue().splitlines()
    rows = [line.split() for line in lines]
    assert rows[1] == ["policy", "self-swap", "FIFO"]
    assert ["interactive", "wait", "p95", "3.0", "s", "3.0", "s", "3.0", "s"] in rows
    assert ["lost", "0", "0", "0"] in rows
    # The one request was told the default load time (no load seen yet), and waited 3 s.
    assert (
        "ETA given on arrival, checked when sent: 0% within ±20% (or 1 s) of 1, median error 7.0 s"
    ) in lines
    at = lines.index("Targets against self-swapping servers:")
    # One request, one load either way: no third of anything.
    assert lines[at + 1] == "  MISS  interactive p95: 3.0 s, at most a third of 3.0 s"
    assert "  MISS  loads: 1, at most a third of 1" in lines[at + 1 :]
    assert lines[-1] == "  met   lost: 0"


def test_command_generates_the_mixed_day():
    out = StringIO()
    call_command("simulate", "--day", "mixed", "--seed", "1", "--hours", "1", stdout=out)
    first_hour = generate_mixed_day(1, hours=1)
    assert out.getvalue().startswith(f"{len(first_hour.requests)} requests (generated mixed day")


def test_command_generates_the_default_day_and_can_save_it(tmp_path):
    out = StringIO()
    saved = tmp_path / "d.json"
    call_command("simulate", "--seed", "2", "--hours", "2", "--write-trace", saved, stdout=out)
    morning = generate_day(2, hours=2)
    expected = f"{len(morning.requests)} requests (generated default day, seed 2"
    assert out.getvalue().startswith(expected)
    assert read_workload(saved) == morning

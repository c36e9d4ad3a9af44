"""Scenario `thrash`: a slice of the mixed day replayed on real processes, against a serial
FIFO and self-swapping servers on the same requests."""

import re
from collections import Counter

from dashboard.eta_checks import accuracy_of
from scheduler.models import State

from .. import fleet
from ..context import Context
from ..stack import BENCH, Stack, run_loadgen
from ..stats import Outcome, ms, percentile
from .common import PRIORITY_NAMES, waits_of

SCALED_KNOBS = (
    "MIN_RESIDENCY_S",
    "WARM_WINDOW_S",
    "NORMAL_WARM_WINDOW_S",
    "ACTIVITY_WINDOW_S",
    "AGING_STEP_S",
    "RESCUE_S",
    "URGENT_LOAD_S",
    "MAX_WAIT_INTERACTIVE_S",
    "MAX_WAIT_HIGH_S",
    "MAX_WAIT_NORMAL_S",
    "MAX_WAIT_BACKGROUND_S",
    "RETRY_BASE_S",
    "RETRY_MAX_S",
)
LOAD_LINE = re.compile(r"loading (\S+) on (\S+) \(")


def thrash(ctx: Context) -> Outcome:
    """A slice of the mixed day from scheduler/simulation_workload.py, replayed on the real
    runtime with simulated servers, time scaled down (policy windows scaled alike)."""
    from django.conf import settings

    from scheduler.simulation import simulate_fifo, simulate_policy
    from scheduler.simulation_swap import simulate_self_swapping
    from scheduler.simulation_workload import CLASS_NAMES, generate_day, jittered, window

    # quick: a quarter hour of office traffic; full: the afternoon peak with the bulk job
    start_s, end_s = ctx.pick((10 * 3600, 10 * 3600 + 900), (13 * 3600, 15 * 3600))
    speed = ctx.pick(90.0, 30.0)
    tps = 4.0
    trace = window(generate_day(seed=7, hours=end_s / 3600), start_s, end_s)
    types = {m.name: m.type for m in trace.models}

    def setup(stack: Stack) -> None:
        servers = {
            s.name: fleet.add_server(
                s.name,
                slots=s.slots,
                memory_mb=s.memory_mb,
                max_llm=s.capacity.get("llm", 1),
                max_embedding=s.capacity.get("embedding", 1),
            )
            for s in trace.servers
        }
        for m in trace.models:
            model = fleet.add_model(m.name, m.type)
            for name in m.servers:
                fleet.deploy(
                    servers[name],
                    model,
                    size_mb=m.size_mb,
                    load_seconds=m.load_s,
                    tokens_per_second=tps,
                )

    env = {"SWITCHYARD_SIM_SPEED": str(speed)}
    env |= {f"SWITCHYARD_{k}": str(settings.SWITCHYARD[k] / speed) for k in SCALED_KNOBS}
    arrivals = [
        {
            "at": r.at / speed,
            "model": r.model,
            "kind": "embedding" if types[r.model] == "embedding" else "chat",
            "priority": PRIORITY_NAMES[r.priority],
            "max_tokens": max(1, round(r.duration_s * tps)),
        }
        for r in trace.requests
    ]
    with ctx.stack("thrash", setup, env) as stack:
        (out,) = run_loadgen(
            {"base_url": stack.base_url, "groups": [{"name": "trace", "arrivals": arrivals}]}
        )
        log = "".join(stack.log_text(n) for n in stack.switchyard_pids())
    # The serial FIFO of the original design note on the same requests, on a virtual clock;
    # the policy there too, on the window and on copies of it with its timing shaken: a
    # second of the host is half a minute of the trace, so the runtime never replays it
    # exactly, and how far the loads move with the timing alone is part of the result.
    fifo = simulate_fifo(trace)
    swap = simulate_self_swapping(trace)
    on_clock = simulate_policy(trace)
    simulated = on_clock.loads
    copies = [jittered(trace, seed) for seed in range(1, 40)]
    shaken = [(simulate_policy(c).loads, simulate_fifo(c).loads) for c in copies]
    policy_loads, fifo_loads = sorted(p for p, _ in shaken), sorted(f for _, f in shaken)
    ids = [r["id"] for r in out["results"] if r.get("id")]
    stamps = fleet.timestamps(ids)
    loads = Counter(m.group(1) for m in LOAD_LINE.finditer(log))
    eta = accuracy_of(ids, BENCH)
    rows = []
    for level, name in CLASS_NAMES.items():
        mine = [s for s in stamps.values() if s["priority"] == level]
        waits = waits_of({str(i): s for i, s in enumerate(mine)})
        states = Counter(s["state"] for s in mine)
        p95, fifo_p95 = percentile(waits, 95), fifo.wait_percentile(level, 95)
        swap_p95 = swap.wait_percentile(level, 95)
        rows.append(
            [
                name,
                len(mine),
                states.get(State.COMPLETED, 0),
                sum(v for k, v in states.items() if k != State.COMPLETED),
                ms(percentile(waits, 50)),
                ms(p95),
                round(p95 * speed, 1) if p95 is not None else None,
                round(fifo_p95, 1) if fifo_p95 is not None else None,
                round(swap_p95, 1) if swap_p95 is not None else None,
            ]
        )
    n_loads = sum(loads.values())
    return Outcome(
        "thrash",
        [
            "class",
            "n",
            "completed",
            "not completed",
            "wait p50 ms",
            "wait p95 ms",
            "p95 day-s",
            "FIFO p95 day-s",
            "self-swap p95 day-s",
        ],
        rows,
        [],
        panels=[
            {
                "kind": "bar",
                "title": "p95 wait per class (trace seconds)",
                "ylabel": "s",
                "labels": [r[0] for r in rows],
                "series": {
                    "Switchyard": [r[6] for r in rows],
                    "serial FIFO": [r[7] for r in rows],
                    "self-swapping": [r[8] for r in rows],
                },
            },
            {
                "kind": "bar",
                "title": f"loads ({n_loads} in all)",
                "ylabel": "loads",
                "labels": list(loads),
                "series": {"loads": list(loads.values())},
            },
        ],
        data={
            "speed": speed,
            "window_s": (start_s, end_s),
            "loads": dict(loads),
            "fifo_loads": fifo.loads,
            "self_swap_loads": swap.loads,
            "simulated_loads": simulated,
            "jittered_loads": [{"policy": p, "fifo": f} for p, f in shaken],
            "requests": len(trace.requests),
            "eta": {
                "live_checked": eta.checked,
                "live_within": eta.share,
                "live_median_error_s": eta.median_error_s,
                "virtual_clock_within": on_clock.eta.share,
            },
        },
        notes=[
            f"trace: scheduler.simulation_workload.generate_day(seed=7), "
            f"{start_s / 3600:g}h–{end_s / 3600:g}h, {len(trace.requests)} requests, "
            f"time ×{speed:g}; policy windows and max waits scaled alike",
            f"{n_loads} loads ({len(trace.requests) / max(n_loads, 1):.1f} requests per load) "
            f"against {fifo.loads} for a serial FIFO and {swap.loads} for self-swapping "
            f"servers on the same requests (virtual clock); "
            f"'p95 day-s' converts the wait back to trace seconds",
            f"on a virtual clock the policy loads {simulated} times on this window; on "
            f"{len(copies)} copies with arrivals moved up to ±15 s and durations ±10%, "
            f"{policy_loads[0]}–{policy_loads[-1]} times (median "
            f"{policy_loads[len(copies) // 2]}) against FIFO's {fifo_loads[0]}–{fifo_loads[-1]},"
            f" more than FIFO on {sum(p > f for p, f in shaken)} copies, as many on "
            f"{sum(p == f for p, f in shaken)}",
            f"HTTP statuses: {dict(Counter(r.get('status') for r in out['results']))}",
            f"ETA (first given, checked when sent; live seconds, so ×{speed:g} in trace time): "
            f"{eta.summary()}; on the virtual clock: {on_clock.eta.summary()}",
        ],
    )

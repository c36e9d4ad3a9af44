"""Scenario `overhead`: what Switchyard adds to an instant upstream, c=1 and c=32,
streamed and not, with where a request's time goes."""

from .. import fleet, machine
from ..context import Context
from ..profiling import Profiler
from ..results import breakdown, breakdown_note, c1_targets
from ..stack import Stack, run_loadgen
from ..stats import Outcome, Target, ms
from .common import paired


def overhead(ctx: Context) -> Outcome:
    """Instant upstream, direct vs through Switchyard, c=1 and c=32, streamed and not."""
    counts = {1: ctx.pick(40, 500), 32: ctx.pick(200, 4000)}
    up: dict[str, str] = {}

    def setup(stack: Stack) -> None:
        up["url"] = stack.start_upstream(["bench-instant"])
        server = fleet.add_server("instant", kind="openai", base_url=up["url"], slots=64)
        up["deployment"] = fleet.deploy(server, fleet.add_model("bench-instant"), preload=True)

    runs = [(stream, c) for stream in (False, True) for c in (1, 32)]
    yardstick = machine.round_trips(ctx.db)
    before = fleet.pg_counters() if ctx.db.postgres else None
    with ctx.stack("overhead", setup) as stack:
        fleet.wait_loaded(up["deployment"])
        profiler = (
            Profiler(stack.switchyard_pids(), ctx.results, "overhead") if ctx.profile else None
        )
        phases = []
        cpu_before = stack.cpu()
        for stream, c in runs:
            group = {"name": "run", "model": "bench-instant", "stream": stream, "concurrency": c}
            group |= {"count": counts[c], "duration_s": ctx.pick(1.0, 30)}
            for url in (up["url"], stack.base_url):
                phases.append({"base_url": url, "warmup": 3, "groups": [group]})
        measured = run_loadgen(*phases)
        cpu_after = stack.cpu()
        profile = profiler.stop() if profiler else None
        stamps = fleet.via_timestamps(measured)
    rows, data, targets, notes = [], {}, [], []
    c1_added: float | None = None
    for i, (stream, c, label, run) in enumerate(paired(runs, measured)):
        d_lat, v_lat, d_fb, v_fb = (
            run.direct_latency,
            run.via_latency,
            run.direct_ttfb,
            run.via_ttfb,
        )
        v_ok, d_rps, v_rps = run.via_ok, run.direct_rps, run.via_rps
        added = {p: run.added(p) for p in ("p50", "p95", "p99")}
        added_fb = run.added_ttfb()
        rows.append(
            [
                label,
                len(v_ok),
                ms(d_lat["p50"]),
                ms(v_lat["p50"]),
                ms(added["p50"]),
                ms(added["p95"]),
                ms(added["p99"]),
                ms(d_fb["p50"]),
                ms(v_fb["p50"]),
                ms(added_fb),
                round(d_rps, 1),
                round(v_rps, 1),
                round(v_rps / d_rps, 3) if d_rps else None,
                run.via_errors,
            ]
        )
        parts = breakdown(v_ok, stamps[i])
        data[label] = {
            "direct": {"latency": d_lat, "ttfb": d_fb, "rps": d_rps},
            "switchyard": {"latency": v_lat, "ttfb": v_fb, "rps": v_rps},
            "breakdown_p50_ms": parts,
        }
        notes.append(breakdown_note(label, parts))
        targets += c1_targets(stream, c, run)
        if c == 1 and not stream:
            c1_added = ms(added["p50"])
        if c == 32 and not stream:
            targets.append(
                Target("throughput c=32, non-streamed", round(v_rps, 1), 170, "req/s", True)
            )
    served = sum(len(m["results"]) + 3 for m in measured[1::2])
    cpu_ms = {
        name: round(1000 * (cpu_after[name] - cpu_before[name]) / served, 2)
        for name in cpu_before
        if cpu_before[name] is not None and cpu_after.get(name) is not None
    }
    data["cpu_ms_per_request"] = cpu_ms
    notes.append("CPU per request, ms: " + ", ".join(f"{k} {v}" for k, v in cpu_ms.items()))
    if yardstick:
        data["machine_round_trip_p50_ms"] = yardstick
        notes.append(
            "this machine's round trip, p50 ms (see machine.py): "
            + ", ".join(f"{k} {v}" for k, v in yardstick.items())
        )
        in_trips = machine.in_idle_round_trips(c1_added, yardstick)
        if in_trips is not None:
            data["c1_added_p50_in_idle_round_trips"] = in_trips
            notes.append(f"c=1 added p50 = {in_trips} idle round trips to PostgreSQL")
    if profile:
        data["profile"] = profile
    if before is not None:
        # The processes have exited, so PostgreSQL has counted all they did.
        after = fleet.pg_counters()
        per = {k: round((after[k] - before[k]) / served, 1) for k in before}
        data["postgres_per_request"] = per
        notes.append("PostgreSQL per request: " + ", ".join(f"{k} {v}" for k, v in per.items()))
    labels = [r[0] for r in rows]
    return Outcome(
        "overhead",
        [
            "run",
            "n",
            "direct p50 ms",
            "via p50 ms",
            "added p50 ms",
            "added p95 ms",
            "added p99 ms",
            "direct TTFB ms",
            "via TTFB ms",
            "added TTFB ms",
            "direct req/s",
            "via req/s",
            "via/direct",
            "errors",
        ],
        rows,
        targets,
        panels=[
            {
                "kind": "bar",
                "title": "added latency (via − direct)",
                "ylabel": "ms (log)",
                "logy": True,
                "labels": labels,
                "series": {"p50": [r[4] for r in rows], "p95": [r[5] for r in rows]},
                "hlines": [(5, "5 ms target")],
            },
            {
                "kind": "bar",
                "title": "throughput",
                "ylabel": "req/s",
                "labels": labels,
                "series": {"direct": [r[10] for r in rows], "switchyard": [r[11] for r in rows]},
            },
        ],
        data=data,
        notes=["TTFB: time to the first `data:` event (streamed) or first body byte.", *notes],
    )

"""The seven scenarios. Each builds its fleet on the bench database, starts the processes,
drives them with the load generator and returns an Outcome. Every comparison is measured in
the same run (direct vs through Switchyard, baseline vs under load, shallow vs deep queue)."""

import itertools
import re
import statistics
from collections import Counter
from collections.abc import Callable

from dashboard.eta_checks import accuracy_of
from scheduler.models import Priority, State

from . import fleet, machine
from .context import Context
from .fairness import fairness
from .profiling import Profiler
from .real import real
from .stack import BENCH, Stack, run_loadgen
from .stats import Outcome, Target, ms, percentile, spread
from .viewers import with_dashboards

PRIORITY_NAMES = {p.value: p.label for p in Priority}


def _ok(results: list[dict], group: str | None = None) -> list[dict]:
    return [r for r in results if r.get("status") == 200 and (group is None or r["group"] == group)]


def _errors(results: list[dict]) -> int:
    return sum(1 for r in results if r.get("status") != 200)


def _durations(results: list[dict], key: str = "end") -> list[float]:
    return [r[key] for r in results if r.get(key) is not None]


def _waits(stamps: dict[str, dict], start: str = "created_at", end: str = "started_at") -> list:
    return [s[end] - s[start] for s in stamps.values() if s.get(end) and s.get(start)]


# -- 1. overhead -------------------------------------------------------------------------


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
        stamps = [fleet.timestamps([r["id"] for r in _ok(m["results"])]) for m in measured[1::2]]
    rows, data, targets, notes = [], {}, [], []
    c1_added: float | None = None
    for i, (stream, c) in enumerate(runs):
        direct, via = measured[2 * i], measured[2 * i + 1]
        label = f"{'streamed' if stream else 'non-streamed'} c={c}"
        d_ok, v_ok = _ok(direct["results"]), _ok(via["results"])
        d_lat, v_lat = spread(_durations(d_ok)), spread(_durations(v_ok))
        d_fb = spread(_durations(d_ok, "first_data"))
        v_fb = spread(_durations(v_ok, "first_data"))
        d_rps, v_rps = len(d_ok) / direct["wall_s"], len(v_ok) / via["wall_s"]
        added = {p: _minus(v_lat[p], d_lat[p]) for p in ("p50", "p95", "p99")}
        added_fb = _minus(v_fb["p50"], d_fb["p50"])
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
                _errors(via["results"]),
            ]
        )
        parts = breakdown(v_ok, stamps[i])
        data[label] = {
            "direct": {"latency": d_lat, "ttfb": d_fb, "rps": d_rps},
            "switchyard": {"latency": v_lat, "ttfb": v_fb, "rps": v_rps},
            "breakdown_p50_ms": parts,
        }
        notes.append(f"{label} via, p50 ms: " + ", ".join(f"{k} {v}" for k, v in parts.items()))
        if c == 1 and not stream:
            c1_added = ms(added["p50"])
            targets.append(Target("added p50, c=1, non-streamed", c1_added, 5, "ms"))
        if c == 1 and stream:
            targets.append(Target("added TTFB p50, c=1, streamed", ms(added_fb), 5, "ms"))
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


def breakdown(results: list[dict], stamps: dict[str, dict]) -> dict[str, float | None]:
    """Median of each leg of a request's life, from the client's clock and the row's."""
    legs: dict[str, list[float]] = {
        "send→created": [],
        "created→routed": [],
        "routed→sent": [],
        "sent→finished": [],
        "finished→answered": [],
    }
    for r in results:
        s = stamps.get(r.get("id") or "")
        if not s or not s["started_at"] or not s["finished_at"] or not s["routed_at"]:
            continue
        legs["send→created"].append(s["created_at"] - r["start"])
        legs["created→routed"].append(s["routed_at"] - s["created_at"])
        legs["routed→sent"].append(s["started_at"] - s["routed_at"])
        legs["sent→finished"].append(s["finished_at"] - s["started_at"])
        legs["finished→answered"].append(r["start"] + r["end"] - s["finished_at"])
    return {k: ms(percentile(v, 50)) for k, v in legs.items()}


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# -- 2. head-of-line ---------------------------------------------------------------------


def head_of_line(ctx: Context) -> Outcome:
    """A 90 s load on S1 while requests for a model loaded on S2 keep arriving."""
    speed = ctx.pick(30.0, 10.0)
    load_s, tokens, tps = 90.0, 20, 20.0
    inference_s = tokens / tps / speed
    ids: dict[str, int] = {}

    def setup(stack: Stack) -> None:
        s1 = fleet.add_server("sim-s1", slots=1)
        s2 = fleet.add_server("sim-s2", slots=4)
        fleet.deploy(s1, fleet.add_model("big"), load_seconds=load_s, tokens_per_second=tps)
        ids["small"] = fleet.deploy(
            s2, fleet.add_model("small"), preload=True, load_seconds=1, tokens_per_second=tps
        )

    env = {"SWITCHYARD_SIM_SPEED": str(speed)}
    with ctx.stack("head-of-line", setup, env) as stack:
        fleet.wait_loaded(ids["small"])
        # Arrivals well under what one worker sustains, so that a wait is the policy's doing.
        small = {"name": "small", "model": "small", "max_tokens": tokens, "interval_s": 0.3}
        trigger = {"name": "trigger", "model": "big", "max_tokens": 2, "count": 1}
        base, during = run_loadgen(
            {
                "base_url": stack.base_url,
                "warmup": 3,
                "groups": [{**small, "count": ctx.pick(10, 50)}],
            },
            {
                "base_url": stack.base_url,
                "groups": [trigger, {**small, "duration_s": load_s / speed}],
            },
        )
    big = _ok(during["results"], "trigger")
    load_end = big[0]["end"] if big else None
    t0 = min(r["start"] for r in during["results"])
    under_load = [
        r
        for r in _ok(during["results"], "small")
        if load_end is None or r["start"] - t0 + r["end"] <= load_end
    ]
    b = spread(_durations(_ok(base["results"])))
    u = spread(_durations(under_load))
    rows = [
        ["baseline (S1 idle)", b["n"], ms(b["p50"]), ms(b["p95"]), ms(b["p99"]), ms(inference_s)],
        ["during S1's load", u["n"], ms(u["p50"]), ms(u["p95"]), ms(u["p99"]), ms(inference_s)],
    ]
    ratio = round(u["p95"] / b["p95"], 3) if u["p95"] and b["p95"] else None
    return Outcome(
        "head-of-line",
        ["phase", "n", "p50 ms", "p95 ms", "p99 ms", "inference ms"],
        rows,
        [
            Target("p95 during load", ms(u["p95"]), ms(inference_s + 0.05), "ms"),
        ],
        panels=[
            {
                "kind": "scatter",
                "title": "completion of S2 requests",
                "xlabel": "arrival (s)",
                "ylabel": "ms",
                "series": {
                    "small @ S2": (
                        [r["start"] - t0 for r in _ok(during["results"], "small")],
                        [r["end"] * 1000 for r in _ok(during["results"], "small")],
                    )
                },
                "spans": [(0, load_end or 0, "S1 loading")],
                "hlines": [((inference_s + 0.05) * 1000, "inference + 50 ms")],
            }
        ],
        data={"speed": speed, "load_s_scaled": load_end, "baseline": b, "under_load": u},
        notes=[
            f"simulated time ×{speed:g}: the 90 s load takes {load_s / speed:.1f} s, "
            f"one inference {inference_s * 1000:.0f} ms; p95 during/baseline = {ratio}",
            f"{_errors(during['results'])} errors",
        ],
    )


# -- 3. dispatch -------------------------------------------------------------------------


def dispatch(ctx: Context) -> Outcome:
    """Commit-to-send with the model loaded and a slot free: Request.created_at → started_at,
    split at routed_at."""
    up: dict[str, object] = {}

    def setup(stack: Stack) -> None:
        url = stack.start_upstream(["bench-instant"])
        server = fleet.add_server("instant", kind="openai", base_url=url, slots=16)
        up["deployment"] = fleet.deploy(server, fleet.add_model("bench-instant"), preload=True)

    rows, data, targets = [], {}, []
    with ctx.stack("dispatch", setup) as stack:
        fleet.wait_loaded(up["deployment"])
        phases = [
            {
                "base_url": stack.base_url,
                "warmup": 3,
                "groups": [
                    {
                        "name": "run",
                        "model": "bench-instant",
                        "concurrency": c,
                        "count": ctx.pick(30, 400) * c // 2 + ctx.pick(15, 200),
                        "duration_s": ctx.pick(2, 30),
                    }
                ],
            }
            for c in (1, 8)
        ]
        measured = run_loadgen(*phases)
        stamps_by_c = [fleet.timestamps([r["id"] for r in _ok(m["results"])]) for m in measured]
    hist: list[float] = []
    for c, stamps in zip((1, 8), stamps_by_c, strict=True):
        total = spread(_waits(stamps))
        route = spread(_waits(stamps, "created_at", "routed_at"))
        send = spread(_waits(stamps, "routed_at", "started_at"))
        rows.append(
            [
                f"c={c}",
                total["n"],
                ms(total["p50"]),
                ms(total["p95"]),
                ms(total["p99"]),
                ms(route["p50"]),
                ms(send["p50"]),
            ]
        )
        data[f"c={c}"] = {"commit_to_send": total, "to_routed": route, "routed_to_sent": send}
        if c == 1:
            targets += [
                Target("commit→send p50, c=1", ms(total["p50"]), 5, "ms"),
                Target("commit→send p99, c=1", ms(total["p99"]), 25, "ms"),
            ]
            hist = [w * 1000 for w in _waits(stamps)]
    return Outcome(
        "dispatch",
        ["run", "n", "p50 ms", "p95 ms", "p99 ms", "→routed p50 ms", "routed→sent p50 ms"],
        rows,
        targets,
        panels=[
            {"kind": "hist", "title": "commit→send, c=1", "xlabel": "ms", "series": {"c=1": hist}}
        ],
        data=data,
        notes=[
            "created_at is stamped just before the insert commits; started_at once the"
            " dispatch holds the slot, just before the request's row is updated."
        ],
    )


# -- 4. depth ----------------------------------------------------------------------------


def depth(ctx: Context) -> Outcome:
    """Enqueue and dispatch latency of interactive requests behind 100 … 100,000 waiting
    background requests (bulk-inserted for a model whose server is disabled)."""
    levels = ctx.pick([100, 2_000], [100, 10_000, 100_000])
    probes = ctx.pick(15, 60)
    ids: dict[str, object] = {}

    def setup(stack: Stack) -> None:
        url = stack.start_upstream(["fast"])
        server = fleet.add_server("instant", kind="openai", base_url=url, slots=4)
        ids["fast"] = fleet.deploy(server, fleet.add_model("fast"), preload=True)
        parked = fleet.add_server("parked", enabled=False)
        ids["parked"] = fleet.add_model("parked")
        fleet.deploy(parked, ids["parked"])

    rows, series = [], {"enqueue p50": ([], []), "dispatch p50": ([], [])}
    viewers = 20
    watched: dict[str, object] = {}

    def probe_row(level: int) -> list:
        group = {
            "name": "probe",
            "model": "fast",
            "stream": True,
            "priority": "interactive",
            "concurrency": 1,
            "count": probes,
        }
        group["duration_s"] = ctx.pick(1.5, 30)
        (out,) = run_loadgen({"base_url": stack.base_url, "warmup": 2, "groups": [group]})
        ok = _ok(out["results"])
        stamps = fleet.timestamps([r["id"] for r in ok])
        enqueue = spread(_durations(ok, "first_byte"))
        sent = spread(_waits(stamps))
        total = spread(_durations(ok))
        rss = stack.peak_rss()
        worker_rss = rss.get(worker) or rss.get("serve (web+worker)")
        return [
            level,
            len(ok),
            ms(enqueue["p50"]),
            ms(enqueue["p95"]),
            ms(sent["p50"]),
            ms(sent["p95"]),
            ms(total["p50"]),
            round(worker_rss or 0, 1),
        ]

    with ctx.stack("depth", setup) as stack:
        fleet.wait_loaded(ids["fast"])
        worker = "worker-1" if "worker-1" in stack.procs else "web"
        have = 0
        for level in levels:
            fleet.backlog(ids["parked"], level - have)
            have = level
            fleet.nudge_workers(ctx.db.postgres)
            fleet.settle(1.5)  # let the worker plan over the new depth once
            row = probe_row(level)
            rows.append(row)
            series["enqueue p50"][0].append(level)
            series["enqueue p50"][1].append(row[2])
            series["dispatch p50"][0].append(level)
            series["dispatch p50"][1].append(row[4])
        watched = with_dashboards(
            stack.base_url, viewers, lambda: probe_row(level), stack.cpu, worker, ctx.pick(3, 15)
        )
    first, last = rows[0], rows[-1]
    ratio = lambda a, b: round(a / b, 2) if a and b else None  # noqa: E731
    return Outcome(
        "depth",
        [
            "waiting",
            "n",
            "enqueue p50 ms",
            "enqueue p95 ms",
            "dispatch p50 ms",
            "dispatch p95 ms",
            "total p50 ms",
            "worker peak RSS MB",
        ],
        rows,
        [
            Target(f"enqueue p50 at {last[0]:,} / at {first[0]}", ratio(last[2], first[2]), 2, "×"),
            Target(
                f"dispatch p50 at {last[0]:,} / at {first[0]}", ratio(last[4], first[4]), 2, "×"
            ),
            Target(f"worker peak RSS at {last[0]:,}", last[7], 300, "MB"),
            Target(
                f"pushes per dashboard a second, {viewers} open",
                watched.get("max_messages_per_dashboard_per_s"),
                4,
                "/s",
            ),
            Target(
                f"worker CPU with {viewers} dashboards / without",
                watched.get("worker_cpu_ratio"),
                1.25,
                "×",
            ),
        ],
        panels=[
            {
                "kind": "line",
                "title": "latency vs queue depth",
                "xlabel": "waiting requests",
                "ylabel": "ms",
                "logx": True,
                "series": series,
            }
        ],
        notes=[
            "enqueue: time to the first byte of a streamed response (the row is committed).",
            f"dashboards: the deepest line probed again with {viewers} open over websockets "
            f"(signed in as staff): {watched}",
        ],
        data={"dashboards": watched},
    )


# -- 5. priority -------------------------------------------------------------------------


def priority(ctx: Context) -> Outcome:
    """One slot, a flood of background requests, then an interactive request every second."""
    speed = ctx.pick(2.0, 1.0)
    tokens, tps = 8, 16.0
    inference_s = tokens / tps / speed
    flood, arrivals = ctx.pick(200, 1000), ctx.pick(8, 60)
    ids: dict[str, object] = {}

    def setup(stack: Stack) -> None:
        solo = fleet.add_server("solo", slots=1)
        ids["model"] = fleet.add_model("m")
        ids["d"] = fleet.deploy(
            solo, ids["model"], preload=True, load_seconds=1, tokens_per_second=tps
        )

    with ctx.stack("priority", setup, {"SWITCHYARD_SIM_SPEED": str(speed)}) as stack:
        fleet.wait_loaded(ids["d"])
        fleet.backlog(ids["model"], flood, Priority.BACKGROUND, tokens)
        fleet.nudge_workers(ctx.db.postgres)
        fleet.wait_processing()
        group = {
            "name": "interactive",
            "model": "m",
            "priority": "interactive",
            "max_tokens": tokens,
            "interval_s": 1.0 / speed,
            "count": arrivals,
        }
        (out,) = run_loadgen({"base_url": stack.base_url, "groups": [group]})
        background_done = fleet.count_in((State.COMPLETED,), priority=Priority.BACKGROUND)
    stamps = fleet.timestamps([r["id"] for r in _ok(out["results"])])
    waits = _waits(stamps)
    w = spread(waits)
    handoff = spread(fleet.handoffs())
    # Arrivals every two inferences meet the slot later each time, by twice what a request
    # holds it beyond its inference, until they wrap: the waits are a sawtooth.
    climb = statistics.median([b - a for a, b in itertools.pairwise(waits) if b > a] or [0.0])
    rows = [
        [
            "interactive",
            w["n"],
            ms(w["p50"]),
            ms(w["p95"]),
            ms(w["p99"]),
            ms(inference_s),
            background_done,
        ]
    ]
    return Outcome(
        "priority",
        ["class", "n", "wait p50 ms", "wait p95 ms", "wait p99 ms", "inference ms", "bg done"],
        rows,
        [Target("interactive wait p95", ms(w["p95"]), ms(inference_s), "ms")],
        panels=[
            {
                "kind": "scatter",
                "title": "interactive wait (created → sent)",
                "xlabel": "arrival #",
                "ylabel": "ms",
                "series": {"interactive": (list(range(len(waits))), [x * 1000 for x in waits])},
                "hlines": [(inference_s * 1000, "one inference")],
            }
        ],
        data={"speed": speed, "waits_s": waits, "flood": flood, "handoff": handoff},
        notes=[
            f"simulated time ×{speed:g}: one inference {inference_s * 1000:.0f} ms, "
            f"an interactive arrival every {1000 / speed:.0f} ms, {flood} background flooded",
            f"handoff (a request's end to the next one's send) p50 {ms(handoff['p50'])} ms,"
            f" p95 {ms(handoff['p95'])} ms; the waits climb {ms(climb)} ms per arrival (each"
            f" request holds the slot {ms(climb / 2)} ms beyond its inference: the handoff and"
            " the call's own time) and wrap, so their p95 is about a peak of the sawtooth:"
            " inference + that hold, less up to one climb",
            f"{_errors(out['results'])} errors",
        ],
    )


# -- 6. thrash ---------------------------------------------------------------------------

SCALED_KNOBS = (
    "MIN_RESIDENCY_S",
    "WARM_WINDOW_S",
    "ACTIVITY_WINDOW_S",
    "AGING_STEP_S",
    "MAX_WAIT_INTERACTIVE_S",
    "MAX_WAIT_HIGH_S",
    "MAX_WAIT_NORMAL_S",
    "MAX_WAIT_BACKGROUND_S",
    "RETRY_BASE_S",
    "RETRY_MAX_S",
)
LOAD_LINE = re.compile(r"loading (\S+) on (\S+) \(")


def thrash(ctx: Context) -> Outcome:
    """A slice of the mixed day from scheduler/simulation_trace.py, replayed on the real
    runtime with simulated servers, time scaled down (policy windows scaled alike)."""
    from django.conf import settings

    from scheduler.simulation import simulate_fifo, simulate_policy
    from scheduler.simulation_swap import simulate_self_swapping
    from scheduler.simulation_trace import CLASS_NAMES, generate_day, jittered, window

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
        waits = _waits({str(i): s for i, s in enumerate(mine)})
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
            f"trace: scheduler.simulation_trace.generate_day(seed=7), "
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


SCENARIOS: dict[str, Callable[[Context], Outcome]] = {
    "overhead": overhead,
    "head-of-line": head_of_line,
    "dispatch": dispatch,
    "depth": depth,
    "priority": priority,
    "thrash": thrash,
    "real": real,
    "fairness": fairness,
}

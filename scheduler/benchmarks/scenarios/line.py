"""The line's scenarios: `head-of-line` (a loaded model's requests pass a long load),
`dispatch` (a backlog sent into free slots) and `depth` (a deep line costs a pass little)."""

from .. import fleet
from ..context import Context
from ..stack import Stack, run_loadgen
from ..stats import Outcome, Target, ms, spread
from ..viewers import with_dashboards
from .common import durations_of, error_count, ok_results, waits_of


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
    big = ok_results(during["results"], "trigger")
    load_end = big[0]["end"] if big else None
    t0 = min(r["start"] for r in during["results"])
    under_load = [
        r
        for r in ok_results(during["results"], "small")
        if load_end is None or r["start"] - t0 + r["end"] <= load_end
    ]
    b = spread(durations_of(ok_results(base["results"])))
    u = spread(durations_of(under_load))
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
                        [r["start"] - t0 for r in ok_results(during["results"], "small")],
                        [r["end"] * 1000 for r in ok_results(during["results"], "small")],
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
            f"{error_count(during['results'])} errors",
        ],
    )


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
        stamps_by_c = [
            fleet.timestamps([r["id"] for r in ok_results(m["results"])]) for m in measured
        ]
    hist: list[float] = []
    for c, stamps in zip((1, 8), stamps_by_c, strict=True):
        total = spread(waits_of(stamps))
        route = spread(waits_of(stamps, "created_at", "routed_at"))
        send = spread(waits_of(stamps, "routed_at", "started_at"))
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
            hist = [w * 1000 for w in waits_of(stamps)]
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
        ok = ok_results(out["results"])
        stamps = fleet.timestamps([r["id"] for r in ok])
        enqueue = spread(durations_of(ok, "first_byte"))
        sent = spread(waits_of(stamps))
        total = spread(durations_of(ok))
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

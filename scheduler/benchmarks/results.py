"""Reading the load generator's results: the calls that succeeded, their durations, and a
run straight to the upstream set beside the same run through Switchyard."""

from collections.abc import Iterator
from dataclasses import dataclass

from .stats import Target, minus, ms, percentile, spread


def ok_results(results: list[dict], group: str | None = None) -> list[dict]:
    return [r for r in results if r.get("status") == 200 and (group is None or r["group"] == group)]


def error_count(results: list[dict]) -> int:
    return sum(1 for r in results if r.get("status") != 200)


def durations_of(results: list[dict], key: str = "end") -> list[float]:
    return [r[key] for r in results if r.get(key) is not None]


@dataclass(frozen=True)
class Compared:
    """One run of calls straight to the upstream and the same run through Switchyard:
    latency and time to first byte (`spread`s of seconds), throughput, what was added."""

    direct_ok: list[dict]
    via_ok: list[dict]
    direct_latency: dict
    via_latency: dict
    direct_ttfb: dict
    via_ttfb: dict
    direct_rps: float
    via_rps: float
    via_errors: int  # calls through Switchyard that did not answer 200

    def added(self, p: str = "p50") -> float | None:
        return minus(self.via_latency[p], self.direct_latency[p])

    def added_ttfb(self) -> float | None:
        return minus(self.via_ttfb["p50"], self.direct_ttfb["p50"])


def compared(direct: dict, via: dict) -> Compared:
    """`direct` and `via`: the load generator's measurements of the same phase."""
    d_ok, v_ok = ok_results(direct["results"]), ok_results(via["results"])
    return Compared(
        d_ok,
        v_ok,
        spread(durations_of(d_ok)),
        spread(durations_of(v_ok)),
        spread(durations_of(d_ok, "first_data")),
        spread(durations_of(v_ok, "first_data")),
        len(d_ok) / direct["wall_s"],
        len(v_ok) / via["wall_s"],
        error_count(via["results"]),
    )


def paired(runs: list[tuple[bool, int]], measured: list[dict]) -> Iterator[tuple]:
    """Each run (streamed?, concurrency) with its label and its `Compared`, from the load
    generator's phases: each run straight to the upstream, then through Switchyard."""
    for i, (stream, c) in enumerate(runs):
        label = f"{'streamed' if stream else 'non-streamed'} c={c}"
        yield stream, c, label, compared(measured[2 * i], measured[2 * i + 1])


def breakdown(results: list[dict], stamps: dict[str, dict]) -> dict[str, float | None]:
    """Median of each leg of a request's life, from the client's clock and the row's
    (`fleet.timestamps`)."""
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


def breakdown_note(label: str, parts: dict[str, float | None]) -> str:
    return f"{label} via, p50 ms: " + ", ".join(f"{k} {v}" for k, v in parts.items())


def c1_targets(stream: bool, c: int, run: Compared) -> list[Target]:
    """The targets of a run at c=1: added p50 (not streamed) or added TTFB (streamed)."""
    if c != 1:
        return []
    if stream:
        return [Target("added TTFB p50, c=1, streamed", ms(run.added_ttfb()), 5, "ms")]
    return [Target("added p50, c=1, non-streamed", ms(run.added()), 5, "ms")]

"""Scenario `priority`: interactive requests pass a background flood."""

import itertools
import statistics

from scheduler.models import Priority, State

from .. import fleet
from ..context import Context
from ..stack import Stack, run_loadgen
from ..stats import Outcome, Target, ms, spread
from .common import error_count, ok_results, waits_of


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
    stamps = fleet.timestamps([r["id"] for r in ok_results(out["results"])])
    waits = waits_of(stamps)
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
            f"{error_count(out['results'])} errors",
        ],
    )

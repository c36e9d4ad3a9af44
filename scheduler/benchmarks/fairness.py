"""Scenario `fairness`: two API keys on one model, one floods the line, one trickles.

The trickler's requests wait as long with the flood as without it, within one inference
(fair share between keys, scheduler/fair_share.py), and the flood keeps every slot busy."""

from django.utils import timezone

from scheduler.models import Priority, Request, State

from . import fleet
from .context import Context
from .stack import BENCH, Stack, run_loadgen
from .stats import Outcome, Target, ms, spread


def _waits(ids: list[str]) -> list[float]:
    stamps = fleet.timestamps(ids)
    return [s["started_at"] - s["created_at"] for s in stamps.values() if s.get("started_at")]


def overtakes(trickled: list[str], flood: list[dict]) -> tuple[int, int]:
    """The flooder's sends while a request of the trickler waited and the trickler held no
    slot: (all of them, those the worker had seen the trickler's request before: routed
    earlier). The first count includes arrivals that came while a pass was filling the slots
    just freed (no scheduler that does not preempt avoids those); the second is what fair
    share should make 0."""
    mine = list(fleet.timestamps(trickled).values())
    seen = every = 0
    for f in flood:
        sent = f["started_at"]
        if any(p["started_at"] < sent < (p["finished_at"] or sent + 1) for p in mine):
            continue  # the trickler held a slot: its share
        for t in mine:
            if t["created_at"] < sent < t["started_at"]:
                every += 1
                seen += bool(t["routed_at"] and t["routed_at"] < sent)
    return every, seen


def fairness(ctx: Context) -> Outcome:
    speed = ctx.pick(2.0, 1.0)
    tokens, tps, slots = 8, 16.0, 2
    inference_s = tokens / tps / speed
    flood, arrivals = ctx.pick(200, 1000), ctx.pick(10, 40)
    ids: dict[str, object] = {}

    def setup(stack: Stack) -> None:
        shared = fleet.add_server("shared", slots=slots)
        ids["model"] = fleet.add_model("m")
        ids["d"] = fleet.deploy(
            shared, ids["model"], preload=True, load_seconds=1, tokens_per_second=tps
        )

    with ctx.stack("fairness", setup, {"SWITCHYARD_SIM_SPEED": str(speed)}) as stack:
        flooder = ctx.db.api_key_id(ctx.db.create_api_key("flooder"))
        trickler = ctx.db.create_api_key("trickler")
        fleet.wait_loaded(ids["d"])
        trickle = {
            "model": "m",
            "max_tokens": tokens,
            "interval_s": 2 * inference_s,
            "count": arrivals,
            "api_key": trickler,
        }
        # One request first, not measured, in each phase: a load generator just started
        # (its imports, its first connection) on a loaded machine sent its first request
        # hundreds of ms late, two at once, and starved the worker meanwhile.
        (alone,) = run_loadgen(
            {"base_url": stack.base_url, "warmup": 1, "groups": [{**trickle, "name": "alone"}]}
        )
        fleet.backlog(ids["model"], flood, Priority.NORMAL, tokens, api_key_id=flooder)
        fleet.nudge_workers(ctx.db.postgres)
        fleet.wait_processing()
        began = timezone.now()
        (flooded,) = run_loadgen(
            {"base_url": stack.base_url, "warmup": 1, "groups": [{**trickle, "name": "flooded"}]}
        )
        ended = timezone.now()
        sent = Request.objects.using(BENCH).filter(started_at__gte=began, started_at__lt=ended)
        flood_ids = [str(i) for i in sent.filter(api_key=flooder).values_list("id", flat=True)]
        flood_sent = len(flood_ids)
        all_sent = sent.count()
        flood_done = fleet.count_in((State.COMPLETED,), api_key=flooder)
    ok = [r for r in alone["results"] + flooded["results"] if r.get("status") == 200]
    trickled = [r["id"] for r in ok if r["group"] == "flooded"]
    every, seen = overtakes(trickled, list(fleet.timestamps(flood_ids).values()))
    w_alone = spread(_waits([r["id"] for r in ok if r["group"] == "alone"]))
    w_flood = spread(_waits([r["id"] for r in ok if r["group"] == "flooded"]))
    elapsed = (ended - began).total_seconds()
    busy = all_sent * inference_s / (slots * elapsed) if elapsed else None
    errors = sum(1 for r in alone["results"] + flooded["results"] if r.get("status") != 200)
    rows = [
        ["trickler alone", w_alone["n"], ms(w_alone["p50"]), ms(w_alone["p95"]), "-"],
        [
            "trickler, flooded",
            w_flood["n"],
            ms(w_flood["p50"]),
            ms(w_flood["p95"]),
            f"{flood_sent / elapsed:.2f}/s" if elapsed else "-",
        ],
    ]
    limit = (w_alone["p95"] or 0.0) + inference_s
    return Outcome(
        "fairness",
        ["phase", "n", "wait p50 ms", "wait p95 ms", "flooder sent"],
        rows,
        [
            Target("trickler wait p95 flooded", ms(w_flood["p95"]), ms(limit), "ms"),
            Target("flooder sends past a trickler request the worker had seen", seen, 0, ""),
        ],
        data={
            "speed": speed,
            "flood": flood,
            "slots": slots,
            "inference_s": inference_s,
            "busy_share": busy,
            "flood_sent": flood_sent,
            "flood_done": flood_done,
            "overtakes": every,
            "overtakes_seen": seen,
        },
        notes=[
            f"two keys, weight 1 each, one model on {slots} slots; simulated time ×{speed:g}:"
            f" one inference {inference_s * 1000:.0f} ms; the trickler sends {arrivals} requests"
            f" one every {2 * inference_s * 1000:.0f} ms, alone, then behind {flood} of the"
            " flooder's (same class, all waiting before the trickle starts)",
            f"target: the trickler's p95 wait flooded within one inference of its p95 alone"
            f" ({ms(limit)} ms); slots busy while flooded: "
            + (f"{busy:.0%}" if busy is not None else "-")
            + " of their time (each request holds its slot a little beyond its inference)",
            f"the flooder's sends while a trickler request waited and the trickler held no"
            f" slot: {every}, of which {seen} after the worker had routed it (the rest arrived"
            " while a pass was filling the slots just freed)",
            f"{errors} errors",
        ],
    )

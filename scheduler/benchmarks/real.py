"""`real`: the real llama.cpp `llama-server` (b11434, router mode, a tiny model) called
directly and through Switchyard in the same run: the latency and time to first byte that
Switchyard adds at c=1 and c=8, and what a model swap costs through Switchyard against the
same unload and load through the router's own API.

It needs the binary (`make llama-server`) and the integration extra (the tiny model is
written with `gguf`); it runs from a checkout (it borrows the tests' helpers for both)."""

import statistics
import time
from pathlib import Path

import httpx

from . import fleet
from .context import Context
from .loadgen import auth_headers
from .results import breakdown, breakdown_note, c1_targets, paired
from .stack import Stack, run_loadgen
from .stats import Outcome, Target, ms

MODELS = ("tiny-a", "tiny-b")  # one small file under two names: a swap is a real reload
SLOTS = 8


def skipped(why: str) -> Outcome:
    return Outcome("real", ["run"], [], notes=[f"skipped: {why}"])


def real(ctx: Context) -> Outcome:
    try:
        from tests.support import real_llama, tiny_gguf
    except ImportError as error:
        return skipped(f"needs the integration extra and a checkout ({error})")
    if not real_llama.binary().exists():
        return skipped(f"no llama-server at {real_llama.binary()} (`make llama-server`)")
    workdir = ctx.logs / "real-llama"
    workdir.mkdir(parents=True, exist_ok=True)
    model_file = tiny_gguf.build(tiny_gguf.SMALL, _models_dir(ctx))
    preset = workdir / "models.ini"
    sections = {"*": {"c": 512 * SLOTS, "np": SLOTS, "stop-timeout": 2}}
    sections |= {name: {"model": model_file} for name in MODELS}
    preset.write_text(real_llama.preset(sections))
    llama = real_llama.RealLlamaServer(
        ["--models-preset", str(preset), "--models-max", "1"], workdir
    )
    ids: dict[str, int] = {}

    def setup(stack: Stack) -> None:
        server = fleet.add_server(
            "llama", kind="llamacpp", base_url=llama.url, slots=SLOTS, max_llm=1
        )
        for i, name in enumerate(MODELS):
            ids[name] = fleet.deploy(server, fleet.add_model(name), preload=i == 0)

    counts = {1: ctx.pick(20, 200), SLOTS: ctx.pick(40, 400)}
    runs = [(stream, c) for stream in (False, True) for c in (1, SLOTS)]
    env = {"SWITCHYARD_MIN_RESIDENCY_S": "0"}  # every request for the other model swaps
    try:
        with ctx.stack("real", setup, env=env) as stack:
            fleet.wait_loaded(ids[MODELS[0]])
            phases = []
            for stream, c in runs:
                group = {"name": "run", "model": MODELS[0], "stream": stream, "concurrency": c}
                group |= {"count": counts[c], "duration_s": ctx.pick(10, 60)}
                for url in (llama.url, stack.base_url):
                    phases.append({"base_url": url, "warmup": 3, "groups": [group]})
            measured = run_loadgen(*phases)
            stamps = fleet.via_timestamps(measured)
            swaps = ctx.pick(3, 10)
            via_swap, via_warm = swap_through_switchyard(stack.base_url, swaps)
        direct_swap = swap_through_the_router(llama.url, swaps)
    finally:
        llama.stop()
    return outcome(runs, measured, stamps, direct_swap, via_swap, via_warm)


def _models_dir(ctx: Context) -> Path:
    folder = ctx.results / "tiny-gguf"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def chat(client: httpx.Client, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "bench"}], "max_tokens": 8}
    began = time.perf_counter()
    answer = client.post("/v1/chat/completions", json=body)
    answer.raise_for_status()
    return time.perf_counter() - began


def swap_through_switchyard(base_url: str, n: int) -> tuple[list[float], list[float]]:
    """Each call for the other model: Switchyard unloads one and loads the other, then
    sends. A second call right after finds its model loaded (the same call without swap)."""
    swapped, warm = [], []
    with httpx.Client(base_url=base_url, timeout=120, headers=auth_headers()) as client:
        for i in range(n):
            model = MODELS[(i + 1) % 2]
            swapped.append(chat(client, model))
            warm.append(chat(client, model))
    return swapped, warm


def swap_through_the_router(url: str, n: int) -> list[float]:
    """The same swap by hand on the router's own API: unload, wait until it says
    `unloaded`, load, wait until `loaded` (asking every 5 ms)."""
    took = []
    with httpx.Client(base_url=url, timeout=120) as client:

        def until(model: str, value: str) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for entry in client.get("/models").json()["data"]:
                    if entry["id"] == model and entry["status"]["value"] == value:
                        return
                time.sleep(0.005)
            raise RuntimeError(f"{model} never became {value}")

        loaded = next(
            e["id"]
            for e in client.get("/models").json()["data"]
            if e["status"]["value"] == "loaded"
        )
        for _ in range(n):
            other = MODELS[1] if loaded == MODELS[0] else MODELS[0]
            began = time.perf_counter()
            client.post("/models/unload", json={"model": loaded}).raise_for_status()
            until(loaded, "unloaded")
            client.post("/models/load", json={"model": other}).raise_for_status()
            until(other, "loaded")
            took.append(time.perf_counter() - began)
            loaded = other
    return took


def outcome(runs, measured, stamps, direct_swap, via_swap, via_warm) -> Outcome:
    rows, data, targets, legs = [], {}, [], []
    for i, (stream, c, label, run) in enumerate(paired(runs, measured)):
        d_lat, v_lat, d_fb, v_fb = (
            run.direct_latency,
            run.via_latency,
            run.direct_ttfb,
            run.via_ttfb,
        )
        added, added_fb = run.added(), run.added_ttfb()
        rows.append(
            [
                label,
                len(run.via_ok),
                ms(d_lat["p50"]),
                ms(v_lat["p50"]),
                ms(added),
                ms(run.added("p95")),
                ms(d_fb["p50"]),
                ms(v_fb["p50"]),
                ms(added_fb),
                round(run.direct_rps, 1),
                round(run.via_rps, 1),
                run.via_errors,
            ]
        )
        parts = breakdown(run.via_ok, stamps[i])
        data[label] = {
            "direct": {"latency": d_lat, "ttfb": d_fb},
            "via": {"latency": v_lat, "ttfb": v_fb},
            "breakdown_p50_ms": parts,
        }
        legs.append(breakdown_note(label, parts))
        targets += c1_targets(stream, c, run)
    router_swap = statistics.median(direct_swap)
    via_cost = statistics.median(via_swap) - statistics.median(via_warm)
    data["swap_s"] = {
        "router_api": direct_swap,
        "via_swapping_call": via_swap,
        "via_warm_call": via_warm,
    }
    targets.append(
        Target("swap via Switchyard − router's own", ms(via_cost - router_swap), 50, "ms")
    )
    return Outcome(
        "real",
        [
            "run",
            "n",
            "direct p50 ms",
            "via p50 ms",
            "added p50 ms",
            "added p95 ms",
            "direct TTFB ms",
            "via TTFB ms",
            "added TTFB ms",
            "direct req/s",
            "via req/s",
            "errors",
        ],
        rows,
        targets,
        data=data,
        notes=[
            "llama-server b11434 router, tiny 5 MB model, 8 tokens a call; TTFB: first `data:`"
            " event (streamed) or first body byte.",
            f"swap (unload one model, load the other), median of {len(direct_swap)}: router's own"
            f" API {ms(router_swap)} ms; through Switchyard {ms(via_cost)} ms (a call that swaps"
            " minus the same call without a swap).",
            *legs,
        ],
    )

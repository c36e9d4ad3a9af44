"""A second simulated day, shaped like the one issue 34 measured against self-swapping
servers: interactive chat, timed high-priority bursts, agent-to-agent conversations, a
background heartbeat flood and batch waves at fixed times, on three servers of different
kinds holding eight models (loads 3 s to 90 s), several of them with two homes.

`generate_mixed_day(seed)` is the same for the same seed; `manage.py simulate --day mixed`
runs it.
"""

import random

from .simulation_workload import (
    BACKGROUND,
    HIGH,
    INTERACTIVE,
    NORMAL,
    ModelSpec,
    ServerSpec,
    Workload,
    WorkloadRequest,
)

HOUR = 3600.0


def mixed_cluster() -> tuple[tuple[ServerSpec, ...], tuple[ModelSpec, ...]]:
    """A 4-slot 48 GB GPU box, a 2-slot 24 GB one and a 1-slot 16 GB mini PC."""
    caps = {"llm": 2, "embedding": 1}
    servers = (
        ServerSpec("gpu-a", slots=4, memory_mb=48_000, capacity=caps),
        ServerSpec("gpu-b", slots=2, memory_mb=24_000, capacity=caps),
        ServerSpec("mini", slots=1, memory_mb=16_000, capacity={"llm": 1, "embedding": 1}),
    )
    models = (
        ModelSpec("qwen3-0.6b", 3, ("gpu-b", "mini"), size_mb=800),
        ModelSpec("nomic-embed", 4, ("gpu-a", "mini"), type="embedding", size_mb=300),
        ModelSpec("llama3.2-3b", 6, ("gpu-b", "mini"), size_mb=2_500),
        ModelSpec("qwen3-8b", 12, ("gpu-a", "gpu-b"), size_mb=6_000),
        ModelSpec("gemma3-12b", 20, ("gpu-a", "gpu-b"), size_mb=9_000),
        ModelSpec("mistral-small-24b", 40, ("gpu-a", "gpu-b"), size_mb=15_000),
        ModelSpec("qwen3-32b", 60, ("gpu-a",), size_mb=21_000),
        ModelSpec("llama3.3-70b", 90, ("gpu-a",), size_mb=42_000),
    )
    return servers, models


def generate_mixed_day(seed: int = 0, hours: float = 24.0) -> Workload:
    rng = random.Random(seed)
    span = hours * HOUR
    out: list[WorkloadRequest] = []

    def add(at: float, model: str, priority: int, low: float, high: float) -> None:
        if 0 <= at < span:
            duration = round(rng.uniform(low, high), 3)
            out.append(WorkloadRequest(round(at, 3), model, priority, duration))

    # Interactive chat in office hours (9-18), about 60 an hour.
    t = 9 * HOUR
    while t < 18 * HOUR:
        t += rng.expovariate(60 / HOUR)
        model = rng.choices(
            ["qwen3-8b", "gemma3-12b", "llama3.2-3b", "mistral-small-24b"], [5, 3, 2, 1]
        )[0]
        add(t, model, INTERACTIVE, 2, 12)
    # High-priority bursts: 20 requests within a minute, at fixed times.
    for hour in (10.5, 13.25, 15.75):
        for _ in range(20):
            add(hour * HOUR + rng.uniform(0, 60), "mistral-small-24b", HIGH, 2, 8)
    # Agent-to-agent conversations: two agents on two models taking turns, normal class.
    for _ in range(12):
        t = rng.uniform(8 * HOUR, 20 * HOUR)
        pair = rng.choice([("qwen3-8b", "gemma3-12b"), ("qwen3-32b", "qwen3-8b")])
        for turn in range(rng.randint(6, 14)):
            duration = rng.uniform(4, 15)
            add(t, pair[turn % 2], NORMAL, duration, duration)
            t += duration + rng.uniform(1, 5)
    # A background heartbeat flood: small checks every 20 s all day, from two callers.
    t = 0.0
    while t < span:
        add(t, "qwen3-0.6b", BACKGROUND, 0.2, 0.6)
        add(t + 7, "nomic-embed", BACKGROUND, 0.05, 0.2)
        t += 20
    # Batch waves at fixed times: a summarising run on the 70b, an embedding run.
    for hour, model, count, low, high in (
        (2, "llama3.3-70b", 150, 10, 30),
        (12, "qwen3-32b", 120, 5, 20),
        (19, "nomic-embed", 400, 0.1, 0.5),
    ):
        for _ in range(count):
            add(hour * HOUR + rng.uniform(0, 120), model, BACKGROUND, low, high)
    servers, models = mixed_cluster()
    out.sort(key=lambda r: (r.at, r.priority, r.model))
    return Workload(servers=servers, models=models, requests=tuple(out))

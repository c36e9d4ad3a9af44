"""Traces for the policy simulation: the cluster and a day of requests, as one JSON file.

A trace file is a JSON object; every time is in seconds:

    {
      "start": "2026-01-05T00:00:00+00:00",       # wall-clock time of offset 0 (optional)
      "unload_s": 2.0,                            # how long an unload takes (optional)
      "max_wait_s": {"0": 120, "1": 300, "2": 600, "3": 3600},   # per priority (optional)
      "servers": [
        {"name": "gpu-a", "slots": 2, "memory_mb": 48000, "capacity": {"llm": 2}}
      ],
      "models": [
        {"name": "qwen3-8b", "type": "llm", "size_mb": 6000, "load_s": 12,
         "servers": ["gpu-a", "gpu-b"]}
      ],
      "requests": [
        {"at": 31.5, "model": "qwen3-8b", "priority": 0, "duration_s": 4.2}
      ]
    }

`at` is the arrival offset from `start`, `duration_s` how long the server takes to answer once
the request is sent, `priority` 0 interactive, 1 high, 2 normal, 3 background. A model is
deployed on each server it lists. `memory_mb` may be null (no memory budget); `capacity` counts
models of each type a server may hold at once (a type not listed: 1).

`generate_day(seed)` builds the default scenario: three servers, eight models loading in 3 s
to 90 s, and a day of mixed traffic (chat during office hours, an API, batch jobs, a nightly
embedding run, and a bulk background job dropped on the afternoon peak).
"""

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

INTERACTIVE, HIGH, NORMAL, BACKGROUND = 0, 1, 2, 3
CLASS_NAMES = {INTERACTIVE: "interactive", HIGH: "high", NORMAL: "normal", BACKGROUND: "background"}
DEFAULT_MAX_WAIT_S = {INTERACTIVE: 120.0, HIGH: 300.0, NORMAL: 600.0, BACKGROUND: 3600.0}
DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)
DAY_S = 24 * 3600


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    slots: int = 1
    memory_mb: int | None = None
    capacity: dict[str, int] = field(default_factory=lambda: {"llm": 1})
    max_models: int | None = None  # of every type together (a router's --models-max)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    load_s: float
    servers: tuple[str, ...]
    type: str = "llm"
    size_mb: int | None = None


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    at: float
    model: str
    priority: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class Workload:
    servers: tuple[ServerSpec, ...]
    models: tuple[ModelSpec, ...]
    requests: tuple[WorkloadRequest, ...]
    start: datetime = DEFAULT_START
    unload_s: float = 2.0
    max_wait_s: dict[int, float] = field(default_factory=lambda: dict(DEFAULT_MAX_WAIT_S))


class WorkloadError(ValueError):
    """The trace file does not describe a runnable scenario."""


# -- reading and writing -----------------------------------------------------------------


def read_workload(path: str | Path) -> Workload:
    try:
        raw = json.loads(Path(path).read_text())
        trace = Workload(
            servers=tuple(ServerSpec(**s) for s in raw["servers"]),
            models=tuple(ModelSpec(**{**m, "servers": tuple(m["servers"])}) for m in raw["models"]),
            requests=tuple(WorkloadRequest(**r) for r in raw["requests"]),
            start=datetime.fromisoformat(raw["start"]) if "start" in raw else DEFAULT_START,
            unload_s=float(raw.get("unload_s", 2.0)),
            max_wait_s={
                **DEFAULT_MAX_WAIT_S,
                **{int(k): float(v) for k, v in raw.get("max_wait_s", {}).items()},
            },
        )
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise WorkloadError(f"cannot read trace {path}: {error!r}") from error
    check(trace)
    return trace


def write_workload(trace: Workload, path: str | Path) -> None:
    data = {
        "start": trace.start.isoformat(),
        "unload_s": trace.unload_s,
        "max_wait_s": {str(k): v for k, v in trace.max_wait_s.items()},
        "servers": [asdict(s) for s in trace.servers],
        "models": [{**asdict(m), "servers": list(m.servers)} for m in trace.models],
        "requests": [asdict(r) for r in trace.requests],
    }
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def check(trace: Workload) -> None:
    if trace.start.tzinfo is None:
        raise WorkloadError("start must carry a time zone")
    servers = {s.name for s in trace.servers}
    models = {m.name for m in trace.models}
    for m in trace.models:
        if unknown := set(m.servers) - servers:
            raise WorkloadError(f"model {m.name} lists unknown servers {sorted(unknown)}")
    for i, r in enumerate(trace.requests):
        if r.model not in models:
            raise WorkloadError(f"request {i} asks for unknown model {r.model}")
        if r.priority not in trace.max_wait_s:
            raise WorkloadError(f"request {i} has priority {r.priority}, not one of 0-3")
        if r.at < 0 or r.duration_s < 0:
            raise WorkloadError(f"request {i} has a negative time")


# -- variations ---------------------------------------------------------------------------


def window(trace: Workload, start_s: float, end_s: float) -> Workload:
    """The requests that arrive in [start_s, end_s), their times counted from start_s."""
    picked = (replace(r, at=r.at - start_s) for r in trace.requests if start_s <= r.at < end_s)
    return replace(trace, requests=tuple(picked))


def jittered(
    trace: Workload, seed: int, arrival_s: float = 15.0, duration_share: float = 0.1
) -> Workload:
    """The same requests, each arriving up to `arrival_s` earlier or later and taking up to
    `duration_share` more or less time: how much of an outcome is the trace's exact timing.
    The same for the same seed."""
    rng = random.Random(seed)
    moved = [
        replace(
            r,
            at=max(r.at + rng.uniform(-arrival_s, arrival_s), 0.0),
            duration_s=r.duration_s * rng.uniform(1 - duration_share, 1 + duration_share),
        )
        for r in trace.requests
    ]
    return replace(trace, requests=tuple(sorted(moved, key=lambda r: r.at)))


# -- the default day ---------------------------------------------------------------------


def default_cluster() -> tuple[tuple[ServerSpec, ...], tuple[ModelSpec, ...]]:
    """Three GPUs of 48, 24 and 16 GB holding two LLMs each; eight models, 3 s to 90 s."""
    caps = {"llm": 2, "embedding": 1}
    servers = (
        ServerSpec("gpu-a", slots=2, memory_mb=48_000, capacity=caps),
        ServerSpec("gpu-b", slots=2, memory_mb=24_000, capacity=caps),
        ServerSpec("gpu-c", slots=1, memory_mb=16_000, capacity=caps),
    )
    every, big = ("gpu-a", "gpu-b", "gpu-c"), ("gpu-a", "gpu-b")
    models = (
        ModelSpec("qwen3-0.6b", 3, every, size_mb=800),
        ModelSpec("nomic-embed", 4, every, type="embedding", size_mb=300),
        ModelSpec("llama3.2-3b", 6, ("gpu-b", "gpu-c"), size_mb=2_500),
        ModelSpec("qwen3-8b", 12, every, size_mb=6_000),
        ModelSpec("gemma3-12b", 20, big, size_mb=9_000),
        ModelSpec("mistral-small-24b", 40, big, size_mb=15_000),
        ModelSpec("qwen3-32b", 60, big, size_mb=21_000),
        ModelSpec("llama3.3-70b", 90, ("gpu-a",), size_mb=42_000),
    )
    return servers, models


# Seconds of work per request relative to an 8B model.
_SLOWNESS = {
    "qwen3-0.6b": 0.3,
    "nomic-embed": 0.05,
    "llama3.2-3b": 0.5,
    "qwen3-8b": 1.0,
    "gemma3-12b": 1.4,
    "mistral-small-24b": 2.2,
    "qwen3-32b": 3.0,
    "llama3.3-70b": 5.0,
}


def _office(hour: float) -> float:
    if 9 <= hour < 12 or 13 <= hour < 18:
        return 1.0
    if 12 <= hour < 13:
        return 0.6
    return 0.3 if 7 <= hour < 21 else 0.03


def _night(hour: float) -> float:
    return 1.0 if hour < 6 else 0.05


def _steady(hour: float) -> float:
    return 0.7 if 8 <= hour < 20 else 0.3


@dataclass(frozen=True, slots=True)
class _Stream:
    """A Poisson stream of one kind of caller: `per_hour` at the peak of `shape`."""

    priority: int
    per_hour: float
    shape: Callable[[float], float]
    models: dict[str, float]
    base_s: tuple[float, float]


_STREAMS = (
    _Stream(
        INTERACTIVE,
        90,
        _office,
        {
            "qwen3-8b": 0.45,
            "gemma3-12b": 0.25,
            "llama3.2-3b": 0.15,
            "mistral-small-24b": 0.1,
            "llama3.3-70b": 0.05,
        },
        (2, 8),
    ),
    _Stream(
        HIGH,
        40,
        _office,
        {"nomic-embed": 0.3, "qwen3-8b": 0.3, "qwen3-0.6b": 0.2, "mistral-small-24b": 0.2},
        (1, 6),
    ),
    _Stream(NORMAL, 25, _steady, {"qwen3-32b": 0.4, "gemma3-12b": 0.3, "qwen3-8b": 0.3}, (5, 20)),
    _Stream(
        BACKGROUND,
        120,
        _night,
        {"nomic-embed": 0.5, "qwen3-32b": 0.3, "llama3.3-70b": 0.2},
        (3, 15),
    ),
)
_BULK_AT_S, _BULK_SPAN_S, _BULK_COUNT = 14 * 3600, 300, 200


def generate_day(seed: int = 0, hours: float = 24.0) -> Workload:
    """The default scenario, the same for the same seed. `hours` cuts the day short."""
    rng = random.Random(seed)
    span_s = hours * 3600
    requests = []
    for stream in _STREAMS:
        requests += _poisson(rng, stream, span_s)
    if span_s > _BULK_AT_S:
        for _ in range(_BULK_COUNT):
            at = _BULK_AT_S + rng.uniform(0, _BULK_SPAN_S)
            requests.append(_request(rng, at, "qwen3-32b", BACKGROUND, (3, 10)))
    servers, models = default_cluster()
    requests.sort(key=lambda r: (r.at, r.priority, r.model))
    return Workload(servers=servers, models=models, requests=tuple(requests))


def _poisson(rng: random.Random, stream: _Stream, span_s: float) -> list[WorkloadRequest]:
    """Thinning: draw at the peak rate, keep each arrival with the shape's weight then."""
    out = []
    rate_s = stream.per_hour / 3600
    names, weights = list(stream.models), list(stream.models.values())
    t = 0.0
    while True:
        t += -math.log(1.0 - rng.random()) / rate_s
        if t >= span_s:
            return out
        if rng.random() < stream.shape((t % DAY_S) / 3600):
            model = rng.choices(names, weights)[0]
            out.append(_request(rng, t, model, stream.priority, stream.base_s))


def _request(
    rng: random.Random, at: float, model: str, priority: int, base_s: tuple[float, float]
) -> WorkloadRequest:
    duration = rng.uniform(*base_s) * _SLOWNESS[model]
    return WorkloadRequest(round(at, 3), model, priority, round(max(duration, 0.05), 3))

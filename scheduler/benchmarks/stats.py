"""Percentiles and the shape every scenario reports in."""

from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def spread(values: list[float]) -> dict[str, float | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
    }


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


@dataclass
class Target:
    name: str
    value: float | None
    limit: float
    unit: str
    at_least: bool = False  # the value must reach the limit rather than stay under it

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "target": f"{'≥' if self.at_least else '≤'} {self.limit:g} {self.unit}",
            "met": self.met,
        }


@dataclass
class Outcome:
    """What a scenario reports: one table, the targets it checks, chart panels, raw data."""

    scenario: str
    columns: list[str]
    rows: list[list[Any]]
    targets: list[Target] = field(default_factory=list)
    panels: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def minus(a: float | None, b: float | None) -> float | None:
    """a - b, or None when either is unknown."""
    return None if a is None or b is None else a - b

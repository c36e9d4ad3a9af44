"""What the scenarios share: reading the load generator's results and the rows' stamps."""

from scheduler.models import Priority

from ..results import Compared, compared, durations_of, error_count, ok_results, paired

__all__ = [
    "Compared",
    "compared",
    "durations_of",
    "error_count",
    "ok_results",
    "paired",
    "waits_of",
]

PRIORITY_NAMES = {p.value: p.label for p in Priority}


def waits_of(stamps: dict[str, dict], start: str = "created_at", end: str = "started_at") -> list:
    return [s[end] - s[start] for s in stamps.values() if s.get(end) and s.get(start)]

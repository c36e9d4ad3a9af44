"""What the scenarios share: reading the load generator's results and the rows' stamps."""

from scheduler.models import Priority

PRIORITY_NAMES = {p.value: p.label for p in Priority}


def ok_results(results: list[dict], group: str | None = None) -> list[dict]:
    return [r for r in results if r.get("status") == 200 and (group is None or r["group"] == group)]


def error_count(results: list[dict]) -> int:
    return sum(1 for r in results if r.get("status") != 200)


def durations_of(results: list[dict], key: str = "end") -> list[float]:
    return [r[key] for r in results if r.get(key) is not None]


def waits_of(stamps: dict[str, dict], start: str = "created_at", end: str = "started_at") -> list:
    return [s[end] - s[start] for s in stamps.values() if s.get(end) and s.get(start)]

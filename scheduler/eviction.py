"""Which models must leave a server so that another can load there. Pure.

The value of keeping an idle model is what it would cost to bring it back, spread over how
long it has been idle:

    keep_value = expected_load_s / max(idle_s, 1)

The model with the lowest value goes first: at equal idleness a model that takes 90 s to
load is kept over one that takes 3 s, and at equal load time the least recently used goes.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from .snapshot import DeploymentView, ServerView


@dataclass(frozen=True, slots=True)
class NoRoom:
    """The target cannot load now; `permanent` when waiting will never help."""

    reason: str
    permanent: bool = False


def keep_value(deployment: DeploymentView, now: datetime, default_load_s: float) -> float:
    last = deployment.last_used_at or deployment.loaded_at
    idle_s = (now - last).total_seconds() if last else float("inf")
    return (deployment.avg_load_s or default_load_s) / max(idle_s, 1.0)


def evictions_for(
    target: DeploymentView,
    server: ServerView,
    resident: Iterable[DeploymentView],
    now: datetime,
    may_evict: Callable[[DeploymentView], bool],
    default_load_s: float = 10.0,
) -> tuple[int, ...] | NoRoom:
    """The deployments to unload so that `target` fits on `server`, cheapest first.

    `resident` is what the server holds or is bringing in (loading, loaded, unloading);
    `may_evict` is the policy's say on idle models (residency, guards, collation).
    """
    others = [d for d in resident if d.id != target.id and d.occupies_room]
    if server.memory_mb is not None and (target.size_mb or 0) > server.memory_mb:
        return NoRoom(
            f"{target.model} needs {target.size_mb} MB, more than {server.name}'s budget "
            f"of {server.memory_mb} MB",
            permanent=True,
        )

    must_go: list[DeploymentView] = []
    if target.device == "npu":
        must_go = [d for d in others if d.device == "npu"]

    def over_capacity(kept: list[DeploymentView]) -> bool:
        same_type = sum(1 for d in kept if d.model_type == target.model_type)
        if same_type + 1 > server.capacity.get(target.model_type, 1):
            return True
        if server.memory_mb is None:
            return False
        used = sum(d.size_mb or 0 for d in kept)
        return used + (target.size_mb or 0) > server.memory_mb

    kept = [d for d in others if d not in must_go]
    candidates = sorted(
        (d for d in kept if d.model_type == target.model_type or server.memory_mb is not None),
        key=lambda d: (keep_value(d, now, default_load_s), d.id),
    )
    for candidate in candidates:
        if not over_capacity(kept):
            break
        if _evictable(candidate, may_evict):
            must_go.append(candidate)
            kept.remove(candidate)

    blocked = [d for d in must_go if not _evictable(d, may_evict)]
    if not over_capacity(kept) and not blocked:
        return tuple(d.id for d in must_go)
    if any(d.pinned for d in blocked) or over_capacity([d for d in others if d.pinned]):
        return NoRoom(f"pinned models leave no room for {target.model} on {server.name}", True)
    return NoRoom(f"{server.name} has no idle model it may unload now")


def _evictable(d: DeploymentView, may_evict: Callable[[DeploymentView], bool]) -> bool:
    return d.state == "loaded" and d.in_flight == 0 and not d.pinned and may_evict(d)

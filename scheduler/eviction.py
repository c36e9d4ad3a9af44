"""Which models must leave a server so that another can load there. Pure.

The value of keeping an idle model is what it would cost to bring it back, spread over how
long it has been idle:

    keep_value = expected_load_s / max(idle_s, 1)

`expected_load_s` is the deployment's measured average load time (the policy's default when
it was never loaded) and `idle_s` the seconds since it was last used (or loaded). The model
with the lowest value goes first: at equal idleness a model that takes 90 s to load is kept
over one that takes 3 s, and at equal load time the least recently used goes.

Only models that help are evicted: when the server is over its count for the target's type,
models of that type; over its count of models in all (`max_models`, a router's
`--models-max`), models of any type; over its memory budget, models with a known size.
Victims are picked cheapest first, then every pick the target fits beside anyway is kept
back.
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
    code: str = "no_room"
    draining: tuple[int, ...] = ()
    """Busy models that may go once idle: the pass sends them no more work (`Switching`)."""


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
    `may_evict` is the policy's say on a model (residency, guards, collation). Pinned
    models, busy models and models not fully loaded are never evicted; the busy models that
    would leave room once idle are named in `NoRoom.draining`.
    """
    limit = server.capacity.get(target.model_type, 1)
    if limit < 1:
        return NoRoom(f"{server.name} takes no {target.model_type} models", True)
    size = target.size_mb or 0
    if server.memory_mb is not None and size > server.memory_mb:
        return NoRoom(
            f"{target.model} needs {size} MB, more than {server.name}'s budget of "
            f"{server.memory_mb} MB",
            permanent=True,
            code="model_too_large",
        )

    others = [d for d in resident if d.id != target.id and d.occupies_room]
    verdicts: dict[int, bool] = {}

    def may_go(d: DeploymentView) -> bool:
        """Whether it may go once idle: loaded, not pinned, and the policy says so."""
        if d.id not in verdicts:
            verdicts[d.id] = d.state == "loaded" and not d.pinned and may_evict(d)
        return verdicts[d.id]

    def evictable(d: DeploymentView) -> bool:
        return d.in_flight == 0 and may_go(d)

    def over(kept: list[DeploymentView]) -> tuple[bool, bool, bool]:
        """(over the type count, over the count in all, over the memory budget) if
        `target` joined `kept`."""
        count = sum(1 for d in kept if d.model_type == target.model_type) + 1 > limit
        total = server.max_models is not None and len(kept) + 1 > server.max_models
        if server.memory_mb is None:
            return count, total, False
        return count, total, sum(d.size_mb or 0 for d in kept) + size > server.memory_mb

    # An NPU runs one model at a time: every other NPU model must go.
    npu = [d for d in others if target.device == "npu" and d.device == "npu"]

    def choose(can_go: Callable[[DeploymentView], bool]) -> tuple[list, list]:
        """(what must go, what stays), cheapest first among those `can_go` allows."""
        must_go = list(npu)
        kept = [d for d in others if d not in must_go]
        by_value = sorted(kept, key=lambda d: (keep_value(d, now, default_load_s), d.id))
        while any(over(kept)):
            count_over, total_over, memory_over = over(kept)
            helpful = [
                d
                for d in by_value
                if d in kept
                and (
                    (count_over and d.model_type == target.model_type)
                    or total_over
                    or (memory_over and (d.size_mb or 0) > 0)
                )
                and can_go(d)
            ]
            if not helpful:
                break
            must_go.append(helpful[0])
            kept.remove(helpful[0])
        # A greedy pick can turn out unneeded (a small model went for the count, then a big
        # one for memory, and the big one alone frees both): keep back every pick the target
        # still fits beside, most valuable first.
        picks = [d for d in must_go if d not in npu]
        for d in sorted(picks, key=lambda d: (-keep_value(d, now, default_load_s), d.id)):
            if not any(over([*kept, d])):
                must_go.remove(d)
                kept.append(d)
        return must_go, kept

    must_go, kept = choose(evictable)
    blocked = [d for d in must_go if not evictable(d)]
    if not any(over(kept)) and not blocked:
        return tuple(d.id for d in must_go)
    if any(d.pinned for d in blocked) or any(over([d for d in others if d.pinned])):
        return NoRoom(f"pinned models leave no room for {target.model} on {server.name}", True)
    # Models still running requests are in the way: those that may go once idle, the pass
    # lets run dry (`NoRoom.draining`), taking them no more work.
    once_idle, left = choose(may_go)
    busy = [d for d in once_idle if d.in_flight]
    if busy and not any(over(left)) and all(may_go(d) for d in once_idle):
        running = sum(d.in_flight for d in busy)
        names = ", ".join(d.model for d in busy)
        return NoRoom(
            f"{server.name} first finishes the {running} running on {names}",
            draining=tuple(d.id for d in busy),
        )
    return NoRoom(f"{server.name} has no idle model it may unload now")

"""The prices behind holding a switch and outranking a queue. Pure arithmetic.

Waiting is paid in class-weighted seconds: a second of waiting costs `class_weight` of the
waiter's effective class (its class after aging), doubling per class up:

    class_weight(c) = 2 ** (3 - c)        background 1, normal 2, high 4, interactive 8,
                                          an interactive request aged one step 16, ...

`scheduler/README.md` ("Holding and outranking") gives each rule with its formula.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta

from .snapshot import PolicyConfig

INTERACTIVE, NORMAL, BACKGROUND = 0, 2, 3
ACTIVITY_SHARE = 0.5
"""How likely interactive work that ran on a server lately comes back for the very model a
switch there evicts, when it did not use that model itself lately."""


def class_weight(effective_class: int) -> float:
    return 2.0 ** (3 - effective_class)


def outranks(
    batch: Sequence[int],
    queue: Sequence[int],
    load_s: float,
    victim_load_s: float,
    slots: int,
    config: PolicyConfig,
) -> bool:
    """Priced collation. Evicting a loaded model with a queue makes the queue wait for the
    batch's load, the batch's runs and its own model's reload; not evicting makes the batch
    wait for the queue to drain:

        evict  iff  Σ_batch w · drain(queue)  >  Σ_queue w · (load_s + drain(batch) + reload_s),
        drain(x) = len(x) · default_run_s / slots

    At equal classes it never evicts; a better class must outweigh the queue's reload.
    """

    def drain(n: int) -> float:
        return n * config.default_run_s / max(slots, 1)

    saves = sum(class_weight(c) for c in batch) * drain(len(queue))
    costs = sum(class_weight(c) for c in queue) * (load_s + drain(len(batch)) + victim_load_s)
    return saves > costs


def rescue_pays(
    mine: int,
    lifetime_s: float,
    queue: Sequence[int],
    queue_rescued: bool,
    victim_load_s: float,
) -> bool:
    """A request that expires unless its load starts now may pass collation, residency and
    the priced hold, when what it loses by expiring (all it waited, its whole lifetime, at
    its weight) outweighs its victim's queue reloading, and none of that queue is about to
    expire itself:

        evict  iff  Σ_queue w · reload_s(victim)  <  w(mine) · lifetime_s
    """
    if queue_rescued:
        return False
    return sum(class_weight(c) for c in queue) * victim_load_s < class_weight(mine) * lifetime_s


def protected_weight(
    mine: int,
    victim_interactive_at: datetime | None,
    server_interactive_at: datetime | None,
    now: datetime,
    config: PolicyConfig,
) -> tuple[float, datetime | None]:
    """The class weight of the protected work a switch is expected to make wait for the
    victim's reload, and until when it is expected: interactive work that used the victim
    within the warm window (`normal_warm_window_s` for normal switches, `warm_window_s` for
    background ones), half that for interactive work on its server within the activity
    window (for background switches); (0, None) when none is expected."""
    window = config.warm_window_s if mine >= BACKGROUND else config.normal_warm_window_s
    warm = timedelta(seconds=window)
    active = timedelta(seconds=config.activity_window_s)
    if mine >= NORMAL and victim_interactive_at and victim_interactive_at + warm > now:
        return class_weight(INTERACTIVE), victim_interactive_at + warm
    if mine >= BACKGROUND and server_interactive_at and server_interactive_at + active > now:
        return class_weight(INTERACTIVE) * ACTIVITY_SHARE, server_interactive_at + active
    return 0.0, None


def hold_saving(victim_back_s: float, protected: float, batched_load_s: float, mine: int) -> float:
    """What holding a switch is expected to save, in class-weighted seconds: the protected
    work's wait for the victim to come back (its reload; on a server with one room, also
    the run of the target's requests then at the server, which the victim cannot come back
    beside), plus (switch batching, when the server has no free slot and another could hold
    the model) the load that requests arriving meanwhile would otherwise need:

        save = back_s(victim) · protected + load_s(target) · class_weight(mine)
        back_s(victim) = reload_s(victim) + run_s(target) · one_room
    """
    return victim_back_s * protected + batched_load_s * class_weight(mine)


def release_at(
    save: float,
    batch: Sequence[tuple[int, datetime]],
    now: datetime,
    protected_until: datetime | None = None,
) -> datetime | None:
    """When the held batch has paid `save` (Σ w · waited_s), at its present rate, and no
    later than `protected_until` when only protection is at stake; None when it has paid it
    already (the switch goes ahead)."""
    if save <= 0 or not batch:
        return None
    paid = sum(class_weight(c) * max((now - at).total_seconds(), 0.0) for c, at in batch)
    if paid >= save:
        return None
    rate = sum(class_weight(c) for c, _ in batch)
    release = now + timedelta(seconds=(save - paid) / rate)
    return min(release, protected_until) if protected_until else release


def parallel_pays(
    queue: Sequence[int],
    load_s: float,
    victim_load_s: float,
    victim_users: float,
    config: PolicyConfig,
    run_s: float | None = None,
) -> bool:
    """A second load of a model with a long queue, evicting an idle model: the queue drains
    twice as fast once the load is done, which saves each queued request about half of what
    is left of the drain; the victim's next user pays its reload:

        evict  iff  Σ_queue w · max(drain_s − load_s, 0) / 2  >  reload_s(victim) · w_users,
        drain_s = len(queue) · run_s / 2

    `run_s` is the queued model's measured run time (`default_run_s` before one is known).
    """
    drain_s = len(queue) * (run_s or config.default_run_s) / 2
    saves = sum(class_weight(c) for c in queue) * max(drain_s - load_s, 0.0) / 2
    return saves > victim_load_s * victim_users


def leave_pays(
    mine: int, wait_s: float, load_s: float, victim_load_s: float, victim_users: float
) -> bool:
    """A request behind a long line for a busy server loads its model on another server
    where it is sent soon, evicting an idle model, when the wait it saves outweighs the
    victim's reload for its next user:

        evict  iff  w(mine) · max(wait_s − load_s, 0)  >  reload_s(victim) · w_users,
        wait_s = line · default_run_s / slots
    """
    return class_weight(mine) * max(wait_s - load_s, 0.0) > victim_load_s * victim_users


RESTORE_PRICE = 4.0
"""How many times a restore must outweigh its victims: it is a guess (interactive work may
not come back), paid for with loads that are certain."""


def restore_pays(load_s: float, since_s: float, victims_cost: float) -> bool:
    """Loading back, on an idle server, a model interactive work used `since_s` ago: the next
    interactive request for it would wait its whole load; its expected cost is priced as
    eviction prices a loaded model (`victim_cost`: reload time over time since last use, at
    the interactive weight). It goes ahead only at several times its victims' cost:

        restore  iff  w(interactive) · load_s / since_s  >  RESTORE_PRICE · Σ victim_cost
    """
    return class_weight(INTERACTIVE) * load_s / max(since_s, 1.0) > RESTORE_PRICE * victims_cost

"""Issue 34's targets for the policy against the self-swapping baseline, checked on a
simulated day (`manage.py simulate` reports them; `tests/scheduler/test_simulation.py`
asserts them):

- every class's p95 wait at most the baseline's; interactive and high at most a third;
- loads (stopped ones included) at most a third of the baseline's;
- nothing expired that the baseline served in time; nothing lost.
"""

from dataclasses import dataclass

from .simulation import Result
from .simulation_workload import CLASS_NAMES, HIGH, INTERACTIVE


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    met: bool
    detail: str


def targets(policy: Result, baseline: Result) -> list[Target]:
    found = []
    for priority, name in CLASS_NAMES.items():
        mine, theirs = policy.wait_percentile(priority, 95), baseline.wait_percentile(priority, 95)
        if mine is None or theirs is None:
            continue
        share = 3 if priority in (INTERACTIVE, HIGH) else 1
        limit = theirs / share
        bound = "a third of " if share == 3 else ""
        found.append(
            Target(
                f"{name} p95",
                mine <= limit,
                f"{mine:.1f} s, at most {bound}{theirs:.1f} s",
            )
        )
    started = policy.loads + policy.stopped  # a stopped load took its server's time too
    found.append(
        Target(
            "loads",
            started <= baseline.loads / 3,
            f"{started}, at most a third of {baseline.loads}",
        )
    )
    late = sum(
        1
        for i, o in policy.outcomes.items()
        if o.state == "expired"
        and baseline.outcomes.get(i)
        and baseline.outcomes[i].state == "completed"
    )
    found.append(Target("expired that the baseline served", late == 0, str(late)))
    found.append(Target("lost", policy.lost == 0, str(policy.lost)))
    return found


def report(found: list[Target]) -> str:
    return "".join(f"  {'met ' if t.met else 'MISS'}  {t.name}: {t.detail}\n" for t in found)

"""How good an ETA was: a request counts as right when it is sent within TOLERANCE of the
ETA it was first given, or within FLOOR_S (an ETA of a few seconds is judged to the
second). `dashboard/eta_checks.py` measures it live, `manage.py simulate` on a day."""

import math
from dataclasses import dataclass, field

TOLERANCE = 0.20
FLOOR_S = 1.0  # an ETA of a second or less is right within a second


def within(eta_s: float, actual_s: float) -> bool:
    return abs(actual_s - eta_s) <= max(TOLERANCE * eta_s, FLOOR_S)


@dataclass
class Accuracy:
    """Of the requests given an ETA and since sent: how many within tolerance, and the
    median of |error| relative to the ETA."""

    checked: int = 0
    within: int = 0
    errors: list[float] = field(default_factory=list)  # seconds, > 0: later than said

    def add(self, eta_s: float, actual_s: float) -> None:
        self.checked += 1
        self.within += within(eta_s, actual_s)
        self.errors.append(actual_s - eta_s)

    @property
    def share(self) -> float | None:
        return self.within / self.checked if self.checked else None

    @property
    def median_error_s(self) -> float | None:
        if not self.errors:
            return None
        ordered = sorted(abs(e) for e in self.errors)
        return ordered[max(math.ceil(len(ordered) / 2) - 1, 0)]

    def summary(self) -> str:
        if not self.checked:
            return "no ETA checked"
        return (
            f"{self.share:.0%} within ±{TOLERANCE:.0%} (or {FLOOR_S:g} s) of {self.checked}, "
            f"median error {self.median_error_s:.1f} s"
        )

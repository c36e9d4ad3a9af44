"""What every scenario gets: the bench database, the scale, and a fresh stack per run."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .stack import BenchDatabase, Stack


@dataclass
class Context:
    db: BenchDatabase
    results: Path
    logs: Path  # this run's own: a later run does not overwrite what explains an outlier
    quick: bool
    workers: int = 1
    profile: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full

    @contextmanager
    def stack(
        self, scenario: str, setup: Callable[[Stack], None], env: dict[str, str] | None = None
    ) -> Iterator[Stack]:
        """Empty the bench database, let `setup` add rows (and start an upstream), start
        Switchyard, and record the peak RSS of its processes when the scenario is done."""
        self.db.empty()
        stack = Stack(self.db, scenario, self.logs, env=env or {}, workers=self.workers)
        began = time.monotonic()
        try:
            setup(stack)
            stack.start_switchyard()
            yield stack
            self.meta = {
                "peak_rss_mb": stack.peak_rss(),
                "env": env or {},
                "duration_s": round(time.monotonic() - began, 1),
            }
        finally:
            stack.stop()

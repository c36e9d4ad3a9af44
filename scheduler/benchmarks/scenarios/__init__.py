"""The bench's scenarios, one module per family. Each builds its fleet on the bench database,
starts the processes, drives them with the load generator and returns an Outcome. Every
comparison is measured in the same run (direct vs through Switchyard, baseline vs under
load, shallow vs deep queue)."""

from collections.abc import Callable

from ..context import Context
from ..fairness import fairness
from ..real import real
from ..stats import Outcome
from .line import depth, dispatch, head_of_line
from .overhead import overhead
from .priority import priority
from .thrash import thrash

SCENARIOS: dict[str, Callable[[Context], Outcome]] = {
    "overhead": overhead,
    "head-of-line": head_of_line,
    "dispatch": dispatch,
    "depth": depth,
    "priority": priority,
    "thrash": thrash,
    "real": real,
    "fairness": fairness,
}

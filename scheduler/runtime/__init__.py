"""The imperative shell of the worker (`run_scheduler`): read a snapshot, ask the policy,
carry out its decisions.

- `loop`: `Runtime`, the loop: passes, wake-ups, leases, the worker's lifecycle.
- `execution`: where each decision kind is carried out (one place each), and `committed`,
  the one way a write that sends requests is made and its calls started.
- `server_tasks`: what the tasks do at the servers (loads, requests, probes, syncs).
- `fast_paths`: the sends done sooner than a pass would (`SWITCHYARD_FAST_PATHS`).
- `effects`: the loop's hands on the world: tasks, adapters, the clock, publishing.

Threads and the state they own. The worker runs one event loop and one database thread
(`database_thread`); pool threads run chores that hold no state of the runtime's.

- The event loop's thread owns all of `Runtime`'s state and that of `Execution`,
  `ServerTasks`, `FastPaths` and `Effects`: only code on the loop reads or writes it.
- The database thread runs the store's functions and `Runtime.plan_and_write`, which owns
  `Runtime.snapshots` and `Runtime.config` (read nowhere else) and reads nothing else of
  the loop's: it is given the worker's id and the arrivals seen, and hands the pass's plan
  for later back to the loop with `call_on_loop` (so do `committed`'s early sends).
- The clock (`Effects.now`) is read from both; it must be thread-safe.
"""

from .effects import Effects
from .execution import MovesAndSends, db
from .fast_paths import FastPaths, SentOnArrival
from .loop import MAX_REPLANS, PURGE_EVERY_S, Runtime
from .server_tasks import FreedSlot, ServerTasks

__all__ = [
    "MAX_REPLANS",
    "PURGE_EVERY_S",
    "MovesAndSends",
    "Effects",
    "FastPaths",
    "FreedSlot",
    "Runtime",
    "SentOnArrival",
    "ServerTasks",
    "db",
]

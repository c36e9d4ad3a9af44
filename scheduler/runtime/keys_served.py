"""When each API key was last served, as the passes saw it: for fair share's tie-break
within a team (`fair_share`, `KeyView.last_served`).

A request that a pass saw waiting and the next does not has left the line (sent, or ended
while it waited): its key was served at that pass. On the database thread, where passes
read their snapshots (as `fast_paths.PassArrivals`). Each worker counts what its own passes
saw; a tie-break needs no more."""

import dataclasses
from typing import Any

from ..snapshot import Snapshot


class KeysServed:
    def __init__(self) -> None:
        self.waiting: dict[Any, int | None] = {}  # request → its key, at the last pass
        self.last: dict[int, int] = {}  # key → the pass that saw one of its requests gone

    def read(self, snapshot: Snapshot, number: int) -> Snapshot:
        """`snapshot` (pass `number`'s) with its keys' `last_served`."""
        waiting = {r.id: r.api_key for r in snapshot.requests}
        for rid, key in self.waiting.items():
            if key is not None and rid not in waiting:
                self.last[key] = number
        self.waiting = waiting
        if not snapshot.teams:  # the tie-break is a team's only
            return snapshot
        keys = tuple(
            dataclasses.replace(k, last_served=self.last.get(k.id, 0)) for k in snapshot.keys
        )
        return dataclasses.replace(snapshot, keys=keys)

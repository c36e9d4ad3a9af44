"""The worker's fast paths: work done sooner than the next pass would do it, all behind one
object and one setting (`SWITCHYARD_FAST_PATHS`, on by default; off, every request waits
for a pass, and the outcomes are the same: only the timings differ, see
tests/scheduler/test_fast_paths.py and docs/performance.md).

- **Send on arrival** (`SendOnArrival`): with nothing waiting, the last pass planned where
  each model's next arrival goes; a new request is routed and sent there as its wake-up
  comes, without a pass.
- **Send next** (`SendNext`): the last pass planned which waiting request takes each slot as
  it frees; a request's completion sends it in the same transaction, unless a request that
  a later pass saw arrive may go first (`PassArrivals`).
- **Serve tasks before the commit**: a dispatch hands its jobs over under its rows' locks,
  and their tasks start (their adapters ready) beside the commit's round trip; each call to
  a server still waits for the commit (`Execution.committed`).
- **The end's NOTIFY to its origin**: a non-streamed request's end reaches the web process
  that waits for it by a NOTIFY in the ending transaction, before the channel layer's hint.

State: `FastPaths` is touched on the event loop's thread only (a pass's plan comes in by
`call_on_loop`); `PassArrivals` on the database thread only.
"""

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

from django.conf import settings

from ..decisions import Route, SendNext, SendOnArrival
from ..group_commit import GroupCommit
from ..models import State
from ..routing import AT_CONVERSATION
from ..snapshot import Snapshot
from ..store import PlannedSend
from ..wakeup import Arrival

if TYPE_CHECKING:
    from .loop import Runtime

log = logging.getLogger(__name__)


def enabled() -> bool:
    return settings.SWITCHYARD.get("FAST_PATHS", True)


class SentOnArrival(NamedTuple):
    """What a new request's send on arrival returns: it went where the last pass planned,
    which that plan foresaw (no news)."""

    request_id: Any


def may_go_first(priority: int, api_key: int, planned: SendNext | PlannedSend) -> bool:
    """Whether a request of class `priority` and key `api_key`, unseen by the plan that
    chose `planned`, may go before it: it is of a better class, or of its class and another
    API key's (fair share decides between them)."""
    theirs = planned.effective_priority
    return priority < theirs or (priority == theirs and api_key != (planned.api_key or 0))


class PassArrivals:
    """The requests each pass's snapshot showed waiting to be placed that the one before had
    not, numbered by pass; on the database thread, where passes read and answers are
    written. The loop hears of an arrival by its wake-up, which can come after a pass has
    read it and routed it: a send planned by an older pass, for a slot freeing then, is not
    made if one of these may go first (`may_go_first`); the next pass fills the slot."""

    KEPT = 64  # passes: a plan is replaced by the next one's

    def __init__(self) -> None:
        self.number = 0
        self.pending: set[Any] = set()
        self.new: deque[tuple[int, int, int]] = deque()  # (pass, class, API key)

    def read(self, snapshot: Snapshot) -> int:
        """A pass read `snapshot`: its number."""
        self.number += 1
        pending = {r.id: r for r in snapshot.requests if r.state == State.PENDING}
        for rid, r in pending.items():
            if rid not in self.pending:
                self.new.append((self.number, r.priority, r.api_key or 0))
        self.pending = set(pending)
        while self.new and self.new[0][0] <= self.number - self.KEPT:
            self.new.popleft()
        return self.number

    def outranked(self, planned: PlannedSend) -> bool:
        for seen, priority, key in reversed(self.new):  # the newest first: few are newer
            if seen <= planned.plan:
                return False
            if may_go_first(priority, key, planned):
                return True
        return False


class FastPaths:
    def __init__(self, runtime: "Runtime", on: bool | None = None) -> None:
        self.runtime = runtime
        self.on = enabled() if on is None else on
        # Per server, what the last pass planned for its slots as they free (`SendNext`),
        # and the classes of the requests that arrived since it was installed.
        self.next_sends: dict[int, list[SendNext]] = {}
        self.plan = 0  # the number of the pass they come from (`PassArrivals`)
        self.arrivals: list[tuple[int, int]] = []  # (class, API key) of each arrival
        # With nothing waiting, where the last pass planned to send each model's next arrival,
        # and the free slots it saw per server, counted down by those sends and up as
        # requests there end (`SendOnArrival`).
        self.on_arrival: dict[str, SendOnArrival] = {}
        self.room: dict[int, int] = {}
        self.slots: dict[int, int] = {}  # server → slots, as of the last snapshot
        self.arrival_sends = GroupCommit(self.write_arrival_sends, runtime.effects.chores)

    @property
    def tasks_before_commit(self) -> bool:
        return self.on

    @property
    def notify_origin(self) -> bool:
        return self.on

    # -- a pass's plan for later ---------------------------------------------------------

    def install(
        self,
        planned: list[SendNext | SendOnArrival],
        arrivals_seen: int,
        slots: dict[int, int],
        plan: int = 0,
    ) -> None:
        """Install pass number `plan`'s plan for the slots that free and the requests that
        arrive, held back for the requests that arrived after its snapshot was read (their
        own pass is coming): the line it saw empty is not."""
        missed, self.arrivals = self.arrivals[arrivals_seen:], []
        self.next_sends, self.on_arrival, self.room = {}, {}, {}
        self.slots, self.plan = slots, plan
        if not self.on:
            return
        for p in planned:
            if isinstance(p, SendNext):
                self.next_sends.setdefault(p.server_id, []).append(p)
            elif not missed:
                self.on_arrival[p.model] = p
                self.room[p.server_id] = p.room
        for priority, api_key in set(missed):
            self.hold_back_for(priority, api_key)

    def hold_back_for(self, arrived: int, api_key: int = 0) -> None:
        """Drop the planned sends that a new request of class `arrived` may outrank: of a
        worse class, or of its class and another API key's (fair share)."""
        for planned in self.next_sends.values():
            planned[:] = [n for n in planned if not may_go_first(arrived, api_key, n)]

    # -- send on arrival -----------------------------------------------------------------

    def arrived(self, arrived: Arrival) -> bool:
        """A new request: sent where the last pass planned its model's next arrival, if it
        can be (True). Else it may outrank what that pass planned for the slots that free
        next: those it could outrank wait for the pass that sees it."""
        if self.send_on_arrival(arrived):
            return True
        self.arrivals.append((arrived.priority, arrived.api_key))
        self.hold_back_for(arrived.priority, arrived.api_key)
        return False

    def send_on_arrival(self, arrived: Arrival) -> bool:
        """Only while the loop is idle (a pass under way or due must see the request first)
        and the server has room. False if it is left to a pass."""
        rt = self.runtime
        planned = self.on_arrival.get(arrived.model)
        if planned is None or not rt.idle or rt.wake.is_set() or rt.stopping:
            return False
        if self.room.get(planned.server_id, 0) <= 0:
            return False
        if arrived.cache_server not in (0, planned.server_id):
            return False  # its conversation's server may be free: a pass weighs that
        self.room[planned.server_id] -= 1
        rt.spawn(f"arrive {arrived.request_id}", self.arrive(arrived, planned))
        return True

    async def arrive(self, arrived: Arrival, planned: SendOnArrival) -> SentOnArrival | None:
        """Route and send a new request as planned (with those arriving meanwhile, in one
        transaction). None, and the next pass decides, if the database refused it: the slot
        or the model gone, or the request taken by another worker."""
        request_id = arrived.request_id
        reason = "model loaded there, sent on arrival"
        if arrived.cache_server == planned.server_id:
            reason = f"model loaded there, {AT_CONVERSATION}, sent on arrival"
        route = Route(request_id, planned.deployment_id, True, reason)
        if not await self.arrival_sends.submit(route):
            self.on_arrival.clear()
            return None
        return SentOnArrival(request_id)

    async def write_arrival_sends(self, routes: list[Route]) -> list[bool]:
        return await self.runtime.execution.send_on_arrival(routes)

    # -- send next -----------------------------------------------------------------------

    def next_send(self, server_id: int) -> PlannedSend | None:
        """The request planned for the slot that just freed on the server, if any is still
        due: taken from every server's plan (it is sent once)."""
        if self.runtime.stopping:
            return None
        planned = self.next_sends.get(server_id)
        now = self.runtime.effects.now()
        while planned:
            n = planned.pop(0)
            if n.expires_at > now:
                for others in self.next_sends.values():
                    others[:] = [o for o in others if o.request_id != n.request_id]
                key = n.api_key or 0
                return PlannedSend(
                    n.request_id, n.deployment_id, n.effective_priority, key, self.plan
                )
        return None

    def slot_freed(self, server_id: int) -> None:
        """A request there ended and nothing was sent into its slot: it is free for the next
        arrival planned there."""
        if server_id in self.room:
            self.room[server_id] = min(self.room[server_id] + 1, self.slots.get(server_id, 0))

    def server_failed(self, server_id: int) -> None:
        """The next pass knows how the server is."""
        self.next_sends.pop(server_id, None)

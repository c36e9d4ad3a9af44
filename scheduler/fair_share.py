"""Fair share between teams and API keys, and their processing quotas: pure rules of the
policy.

Within a class (after aging), the callers with requests waiting share the slots by weight.
A caller is a team (all its keys together) or a key in no team. A caller's i-th waiting
request (its own order, from 0) is tagged (processing + i + 1) / weight, where `processing`
is how many of its requests hold a slot now, and the class is served in tag order. Ties go
to the caller with fewer requests waiting in the class, then to the line's own order: a
plan for the slots that free next (SendNext) is made before anyone knows whose slot frees
first, and a light caller whose own request is about to end must not lose that slot to a
flood that holds as many (it would then wait a whole inference more). A team's own order
is the same rule one level down: its keys share its turns by their weights, but a tie goes
to the key served longest ago (`KeyView.last_served`), then to the one with fewer waiting.
A team held to its `max_processing` decides each turn in a pass after one of its requests
ended, with none of its keys holding a slot: every head ties, and "fewer waiting" alone
would hand every turn to the key just served (it has one fewer each time), so one key's
line ran dry before another key of the team was served at all.

This is weighted fair queuing on slots held, which over time is processing time: a key with
weight 2 holds twice the slots of a key with weight 1 while both have work waiting, and a
caller who floods the line with a thousand requests does not put another caller's one
request behind them all; nor does a team that makes a hundred keys. Requests with no key
(SWITCHYARD_AUTH=off) count as one caller; with one caller the order is the line's own.

A key's or a team's `max_processing` is a quota, not a refusal: requests past it wait until
one of its own ends, while other callers' requests use the free slots."""

import copy
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from .snapshot import KeyView, RequestView, TeamView

NO_KEY = KeyView(id=0)
Caller = tuple[str, int | None]  # ("team", team id) or ("key", key id or None)


class Shares:
    """The keys and teams of a snapshot, as fair share and the quotas see them."""

    def __init__(self, keys: Iterable[KeyView] = (), teams: Iterable[TeamView] = ()) -> None:
        self.keys = {k.id: k for k in keys}
        self.teams = {t.id: t for t in teams}

    def key(self, r: RequestView) -> KeyView:
        return self.keys.get(r.api_key, NO_KEY) if r.api_key is not None else NO_KEY

    def team(self, r: RequestView) -> TeamView | None:
        team = self.key(r).team
        return self.teams.get(team) if team is not None else None

    def caller(self, r: RequestView) -> Caller:
        team = self.team(r)
        return ("team", team.id) if team is not None else ("key", r.api_key)


def fair_order(
    ranked: Iterable[RequestView], effective: Callable[[RequestView], int], shares: Shares
) -> list[RequestView]:
    """`ranked` (best first) reordered so that within each class the callers share by
    weight, and within a team its keys do."""
    lines: dict[tuple[int, Caller], list[tuple[int, RequestView]]] = defaultdict(list)
    for position, r in enumerate(ranked):
        lines[effective(r), shares.caller(r)].append((position, r))
    tagged = []
    for (level, _), line in lines.items():
        share: KeyView | TeamView | None = shares.team(line[0][1])
        if share is not None:
            line = _shared_by_keys(line, shares)
        else:
            share = shares.key(line[0][1])
        for i, (position, r) in enumerate(line):
            tag = (share.processing + i + 1) / max(share.weight, 1)
            tagged.append((level, tag, len(line), position, r))
    tagged.sort(key=lambda t: t[:4])
    return [t[4] for t in tagged]


def _shared_by_keys(
    line: list[tuple[int, RequestView]], shares: Shares
) -> list[tuple[int, RequestView]]:
    """A team's line in one class, its keys sharing it by weight (the same tags, by key)."""
    waiting = Counter(r.api_key for _, r in line)
    nth: Counter[int | None] = Counter()
    tagged = []
    for position, r in line:
        key = shares.key(r)
        i = nth[r.api_key]
        nth[r.api_key] += 1
        tag = (key.processing + i + 1) / max(key.weight, 1)
        tagged.append((tag, key.last_served, waiting[r.api_key], position, r))
    tagged.sort(key=lambda t: t[:4])
    return [(position, r) for *_, position, r in tagged]


class Quota:
    """Slots each key and team may still take in this pass (`max_processing` less what it
    holds)."""

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        self.left: dict[Caller, int] = {
            ("key", k.id): k.max_processing - k.processing
            for k in shares.keys.values()
            if k.max_processing is not None
        }
        self.left.update(
            (("team", t.id), t.max_processing - t.processing)
            for t in shares.teams.values()
            if t.max_processing is not None
        )

    def _limits(self, r: RequestView) -> tuple[Caller, Caller]:
        team = self.shares.team(r)
        return ("key", r.api_key), ("team", team.id if team is not None else None)

    def full(self, r: RequestView) -> tuple[str, int | None] | None:
        """Whose quota holds `r` back ("key" or "team") and its `max_processing`, or None."""
        key, team = self._limits(r)
        if self.left.get(key, 1) <= 0:
            return "key", self.shares.key(r).max_processing
        if self.left.get(team, 1) <= 0:
            found = self.shares.team(r)
            return "team", found.max_processing if found is not None else None
        return None

    def allows(self, r: RequestView) -> bool:
        return all(self.left.get(limit, 1) > 0 for limit in self._limits(r))

    def take(self, r: RequestView) -> None:
        for limit in self._limits(r):
            if limit in self.left:
                self.left[limit] -= 1

    def copy(self) -> "Quota":
        twin = copy.copy(self)
        twin.left = dict(self.left)
        return twin

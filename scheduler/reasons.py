"""Why each waiting request waits: data the policy returns beside its decisions. Pure.

`explain(pass)` reads a finished pass (`policy._Pass`) and gives every request still waiting
in its snapshot one `Reason`: what it waits for now. The pass notes what only it knows as it
goes (a hold and its price, a server that cannot serve, why no load could start); the rest
is read off where the request ended up (its load under way, its place in the ready line).

A reason's `text` stays the same while the reason does (it is stored, and traced, only when
it changes); `live(now)` is what a display shows: a load's progress counted to `now`.
How the API and the pages show a stored one: `reasons_shown.py`.
"""

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from . import fair_share
from .durations import spoken

if TYPE_CHECKING:  # the pass, read only
    from .policy import _Pass

# The kinds, a closed set (docs/api.md lists them).
LOADING = "loading"  # its model is loading for it
HELD = "held"  # a switch that would serve it is held back (a priced rule, a guard window)
BEHIND = "behind"  # routed; other requests go first into the slots
NO_SERVER = "no_server"  # no server can serve its model now (fails after a grace)
NO_ROOM = "no_room"  # no load of its model can start now (rooms busy, a load, a backoff)
QUOTA = "quota"  # its API key's or team's max_processing is reached
RETRY = "retry"  # a retry, not sent before its backoff ends
EVICTED = "evicted"  # sent back by our own eviction of its model
REQUEUED = "requeued"  # sent back for another cause (its server went away, a load failed)
WAITING = "waiting"  # none of the above is known (to be placed at the next pass)
KINDS = (LOADING, HELD, BEHIND, NO_SERVER, NO_ROOM, QUOTA, RETRY, EVICTED, REQUEUED, WAITING)

CLASS_NAMES = ("interactive", "high", "normal", "background")
EXACT_UP_TO = 10  # "behind 7 requests" exactly; beyond, by steps, so a long line moving
STEPS = (10, 20, 50, 100, 200, 500, 1000)  # forward changes (and stores) few reasons


@dataclass(frozen=True, slots=True)
class Reason:
    kind: str
    text: str
    details: tuple[tuple[str, Any], ...] = ()
    """Facts behind the text, as (name, value) pairs: `server`, `model`, `until` (when it
    lifts, if known), `started_at` and `expected_s` (a load), `ahead` (a line), …"""

    def detail(self, name: str, default: Any = None) -> Any:
        return dict(self.details).get(name, default)

    def live(self, now: datetime, reported: float | None = None) -> str:
        """The text as of `now`: a load says how far it is (`reported`: the server's own
        fraction, when it gives one)."""
        return live_text(self.kind, self.text, dict(self.details), now, reported)

    def as_json(self) -> dict:
        details = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in self.details}
        return {"kind": self.kind, "text": self.text, "details": details}


def live_text(
    kind: str,
    text: str,
    details: Mapping[str, Any],
    now: datetime,
    reported: float | None = None,
) -> str:
    """A stored reason's text as of `now` (its details as `Reason.as_json` gives them). A
    load's progress is the server's own fraction when it `reported` one (the page's bar
    shows that one too), else the time elapsed against the policy's estimate, or past it."""
    started, expected = details.get("started_at"), details.get("expected_s")
    if kind != LOADING or started is None or expected is None:
        return text
    if isinstance(started, str):
        started = datetime.fromisoformat(started)
    elapsed = max((now - started).total_seconds(), 0.0)
    if leaving := details.get("unloading"):
        progress = f"which first unloads {leaving} ({spoken(elapsed)} so far)"
    elif reported is None and elapsed > expected:
        progress = f"{spoken(elapsed)}, past the ~{spoken(expected)} expected"
    elif reported is None:
        progress = f"{spoken(elapsed)} of ~{spoken(expected)}"
    else:
        progress = f"{reported:.0%} after {spoken(elapsed)}, as the server reports"
    return f"waiting for the load of {details.get('model')} on {details.get('server')}, {progress}"


NOT_BEFORE = (HELD, NO_ROOM, RETRY)  # kinds whose `until` is when it may go at the earliest


def not_before(stored: Mapping[str, Any] | None) -> datetime | None:
    """When a stored reason (`Reason.as_json`) says its request may go at the earliest: a
    hold's end, a load's next chance, a retry's backoff; None when it says nothing of it."""
    if not stored or stored.get("kind") not in NOT_BEFORE:
        return None
    until = (stored.get("details") or {}).get("until")
    return datetime.fromisoformat(until) if until else None


def clock(at: datetime) -> str:
    return f"{at:%H:%M:%S}"


def make(kind: str, text: str, **details: Any) -> Reason:
    return Reason(kind, text, tuple((k, v) for k, v in details.items() if v is not None))


# -- what the pass notes as it goes ------------------------------------------------------


def about(n: int) -> str:
    """`7`; past `EXACT_UP_TO`, its step (`20+`): a count that moves by one rewrites few
    stored reasons."""
    return str(n) if n <= EXACT_UP_TO else f"{max(s for s in STEPS if s <= n)}+"


def held(
    rule: str,
    server: str,
    victim: str,
    until: datetime | None,
    saves_s: float | None = None,
    waited: int = 0,
) -> Reason:
    """A switch on `server` (evicting `victim`) held back by `rule` (`waited`: the requests
    that waited for the victim's load, for no wasted load)."""
    when = f" until {clock(until)}" if until else ""
    text = {
        "no_wasted_load": f"held: {victim} on {server} first serves the {about(waited)}"
        f" {'request' if waited == 1 else 'requests'} that waited for its load",
        "collation": f"held: {victim} on {server} serves the requests waiting for it first",
        "residency": f"held: {victim} on {server} keeps its minimum residency{when}",
        "protected": f"held: switch on {server} keeps {victim} for interactive work{when}",
        "draining": f"held: {victim} on {server} takes no more until it gives way to a"
        " better class's load",
    }.get(rule, f"held: switch on {server} batched{when}")
    if rule == "batching" and saves_s:
        text += f", saves a load of {saves_s:.0f} s"
    return make(HELD, text, rule=rule, server=server, model=victim, until=until, saves_s=saves_s)


def no_server(model: str, why: str, deadline: datetime) -> Reason:
    return make(
        NO_SERVER,
        f"no server can serve {model}: {why}; fails at {clock(deadline)} unless one comes back",
        model=model,
        until=deadline,
    )


def failed_load(model: str, server: str, error: str) -> str:
    """A deployment failed for good (its attempts spent, or the server has no such model):
    said to the requests that fail for it, with what lets it load again."""
    return (
        f"{model} failed to load on {server}: {error or '?'}"
        " (not tried there again until an operator resets it)"
    )


def no_room(
    model: str, why: Iterable[str], until: datetime | None, server: str | None = None
) -> Reason:
    """`server`: the one server that could load it, where there is only one."""
    when = f" (again at {clock(until)})" if until else ""
    text = "; ".join(dict.fromkeys(why)) or "no server can take it now"
    return make(
        NO_ROOM,
        f"no load of {model} can start now: {text}{when}",
        model=model,
        server=server,
        until=until,
    )


def stopping(model: str, victim: str, server: str) -> Reason:
    """No load of `model` can start before the load of `victim` on `server`, which nobody
    waits for any more, is stopped."""
    return make(
        NO_ROOM,
        f"waiting for the stop of {victim}'s load on {server} (nobody waits for it)",
        model=model,
        server=server,
        stopping=victim,
    )


def sooner(a: Reason | None, b: Reason) -> Reason:
    """Of two notes for one request, the one that lifts first (known times first)."""
    if a is None:
        return b
    ta, tb = a.detail("until"), b.detail("until")
    return b if tb is not None and (ta is None or tb < ta) else a


# -- what is read off the pass's end ----------------------------------------------------


def explain(p: "_Pass") -> dict[UUID, Reason]:
    """The reason of each request the pass leaves waiting."""
    requeued: dict[UUID, str] = {}
    for d in p.decisions:
        if type(d).__name__ == "Requeue":
            requeued[d.request_id] = d.reason
    # What unloads on a server while a load is under way there is that load's victims.
    unloading: dict[int, list[str]] = {}
    for x in p.deployments.values():
        if x.state == "unloading":
            unloading.setdefault(x.server_id, []).append(x.model)
    leaving = {server_id: ", ".join(sorted(names)) for server_id, names in unloading.items()}
    found: dict[UUID, Reason] = {}
    for r in p.requests.values():
        if r.state == "needs_loading":
            found[r.id] = loading(p, r, leaving)
        elif r.state == "pending":
            note = p.notes.get(r.id)
            if note is None and r.id in requeued:
                why = requeued[r.id]
                note = make(EVICTED if why.startswith("evicted from") else REQUEUED, why)
            found[r.id] = note or make(WAITING, "waiting to be placed")
    found.update(ready_line(p))
    return found


def loading(p: "_Pass", r, leaving: dict[int, str]) -> Reason:
    """The load `r` waits for; while it first unloads its victims (`leaving`, by server:
    the server may let what others run on them finish first), it says so."""
    d = p.deployments[r.deployment_id]
    server = p.servers[d.server_id].name
    expected = p.load_s(d)
    started = d.load_started_at or p.now
    victims = leaving.get(d.server_id, "")
    first = f", which first unloads {victims}" if victims else ""
    return make(
        LOADING,
        f"waiting for the load of {d.model} on {server} (~{spoken(expected)}){first}",
        model=d.model,
        server=server,
        started_at=started,
        expected_s=round(expected, 3),
        **({"unloading": victims} if victims else {}),
    )


def ready_line(p: "_Pass") -> dict[UUID, Reason]:
    """Routed requests not sent: a retry's backoff, a key's quota, or those ahead of it for
    its server's slots (in the order `dispatch` sends them). Linear in the line: past
    `EXACT_UP_TO` ahead, the requests of one server share a reason per step."""
    found: dict[UUID, Reason] = {}
    ready = p.ranked("ready")  # the pass's own order: no ranking again
    if not ready:
        return found
    level = {r.id: p.effective(r) for r in ready}
    ahead: dict[str, Counter[str]] = {}
    by_step: dict[tuple[str, int], Reason] = {}
    for r in fair_share.fair_order(ready, lambda r: level[r.id], p.shares):
        if p.backing_off(r):
            found[r.id] = make(
                RETRY, f"a retry, sent after {clock(r.not_before)}", until=r.not_before
            )
            continue
        full = p.quota.full(r)
        if full is not None:
            whose, most = full
            found[r.id] = make(
                QUOTA,
                f"its {'API key' if whose == 'key' else 'team'}'s quota is full ({most}"
                " processing at once)",
                max_processing=most,
                whose=whose,
            )
            continue
        drained = p.notes.get(r.id)  # its model runs dry for a better class (`drain`)
        if drained is not None and drained.detail("rule") == "draining":
            found[r.id] = drained
            continue
        d = p.deployments[r.deployment_id]
        server = p.servers[d.server_id].name
        # A model at its own slots waits for one of them, not for the server's.
        where = f"on {server}"
        if d.slots is not None and d.in_flight >= d.slots:
            where = f"for {d.model} on {server} ({d.slots} at once)"
        line = ahead.setdefault(where, Counter())
        n = line.total()
        if n > EXACT_UP_TO:
            step = max(s for s in STEPS if s <= n)
            if (where, step) not in by_step:
                by_step[where, step] = make(
                    BEHIND, f"behind {step}+ requests {where}", server=server, ahead=step
                )
            found[r.id] = by_step[where, step]
        else:
            found[r.id] = behind(line, server, where)
        line[class_name(level[r.id])] += 1
    return found


def class_name(effective: int) -> str:
    return CLASS_NAMES[min(max(effective, 0), len(CLASS_NAMES) - 1)]


def behind(line: Counter[str], server: str, where: str) -> Reason:
    """Behind the requests of `line` (counts by class), at most `EXACT_UP_TO` of them, for
    the slots `where` says (`on <server>`, or `for <model> on <server> (N at once)` for a
    model at its own slots)."""
    n = line.total()
    if n == 0:
        return make(BEHIND, f"next for a slot {where}", server=server, ahead=0)
    classes = [(c, line[c]) for c in CLASS_NAMES if line[c]]
    if len(classes) == 1:
        cls, _ = classes[0]
        noun = "request" if n == 1 else "requests"
        text = f"behind {n} {cls} {noun} {where}"
    else:
        parts = ", ".join(f"{k} {c}" for c, k in classes)
        text = f"behind {n} requests {where} ({parts})"
    return make(BEHIND, text, server=server, ahead=n)

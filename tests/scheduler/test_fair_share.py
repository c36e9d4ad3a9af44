"""Fair share between teams and API keys, and their processing quotas
(scheduler/fair_share.py).

Pure: no database, no clock. Each test says what would break if it failed."""

import uuid
from dataclasses import replace
from datetime import timedelta

from django.utils import timezone

from scheduler import reasons, wakeup
from scheduler.decisions import Dispatch, SendNext
from scheduler.fair_share import Shares, fair_order
from scheduler.policy import effective_priority, plan, plan_explained
from scheduler.runtime import Runtime
from scheduler.snapshot import KeyView, TeamView

from .builders import HIGH, NORMAL, at, dep, of, req, server, snap

FLOODER, TRICKLER = 1, 2


def with_keys(snapshot, *keys: KeyView, teams: tuple[TeamView, ...] = ()):
    return replace(snapshot, keys=tuple(keys), teams=teams)


def ready(n: int, key: int | None, first_age_s: float, priority: int = NORMAL) -> list:
    """`n` ready requests of one key on deployment 1, the first `first_age_s` old."""
    return [
        req(
            "m", priority, age_s=first_age_s - i * 0.01, state="ready", deployment_id=1, api_key=key
        )
        for i in range(n)
    ]


def dispatched(decisions) -> list:
    return [d.request_id for d in of(decisions, Dispatch)]


def test_a_flood_does_not_put_another_keys_request_behind_it():
    """Without it, the trickler's one request would wait for the flooder's thousand."""
    flood = ready(1000, FLOODER, first_age_s=60)
    mine = ready(1, TRICKLER, first_age_s=1)
    s = snap([server(1, slots=4)], [dep(1, 1, "m", "loaded", in_flight=3)], flood + mine)
    s = with_keys(s, KeyView(FLOODER, processing=3), KeyView(TRICKLER))
    assert dispatched(plan(s, at(0))) == [mine[0].id]


def test_keys_share_the_slots_by_weight():
    """Weight 2 takes two slots for each of weight 1, while both have work waiting."""
    heavy = ready(10, FLOODER, first_age_s=60)
    light = ready(10, TRICKLER, first_age_s=30)
    s = snap([server(1, slots=6)], [dep(1, 1, "m", "loaded")], heavy + light)
    s = with_keys(s, KeyView(FLOODER, weight=2), KeyView(TRICKLER, weight=1))
    sent = set(dispatched(plan(s, at(0))))
    assert len(sent & {r.id for r in heavy}) == 4
    assert len(sent & {r.id for r in light}) == 2


def test_fair_share_stays_within_a_class():
    """A key's high request still goes before another key's normal one: fair share does not
    undo the classes."""
    normal = ready(1, TRICKLER, first_age_s=60)
    high = ready(5, FLOODER, first_age_s=1, priority=HIGH)
    s = snap([server(1, slots=1)], [dep(1, 1, "m", "loaded")], normal + high)
    s = with_keys(s, KeyView(FLOODER, processing=0), KeyView(TRICKLER))
    assert dispatched(plan(s, at(0))) == [high[0].id]


def test_one_caller_keeps_the_lines_own_order():
    """With auth off (no keys) or one key, fair share changes nothing."""
    for key in (None, FLOODER):
        line = ready(5, key, first_age_s=10)
        effective = lambda r: effective_priority(r, at(0), 150.0)  # noqa: E731
        shares = Shares([KeyView(FLOODER, processing=7)])
        assert fair_order(line, effective, shares) == line


def test_a_key_at_its_quota_waits_while_others_use_the_free_slots():
    """max_processing is a quota, not a refusal: the key's request waits (no Fail), and the
    free slot goes to another key's request even though it came later."""
    capped = ready(3, FLOODER, first_age_s=60)
    other = ready(1, TRICKLER, first_age_s=1)
    s = snap([server(1, slots=4)], [dep(1, 1, "m", "loaded", in_flight=2)], capped + other)
    s = with_keys(s, KeyView(FLOODER, max_processing=2, processing=2), KeyView(TRICKLER))
    decisions = plan(s, at(0))
    assert dispatched(decisions) == [other[0].id]
    assert not [d for d in decisions if type(d).__name__ == "Fail"]


def test_a_quota_counts_what_the_pass_itself_sends():
    """Two free slots, one left in the key's quota: one of its requests goes, not two."""
    capped = ready(3, FLOODER, first_age_s=60)
    s = snap([server(1, slots=4)], [dep(1, 1, "m", "loaded", in_flight=2)], capped)
    s = with_keys(s, KeyView(FLOODER, max_processing=3, processing=2))
    assert dispatched(plan(s, at(0))) == [capped[0].id]


def test_send_next_follows_fair_share_and_quota():
    """What the worker sends as slots free is planned the same way: the trickler's request
    first, and no more of a capped key's than its quota leaves."""
    flood = ready(10, FLOODER, first_age_s=60)
    mine = ready(1, TRICKLER, first_age_s=1)
    s = snap([server(1, slots=2)], [dep(1, 1, "m", "loaded", in_flight=2)], flood + mine)
    s = with_keys(s, KeyView(FLOODER, processing=1, max_processing=2), KeyView(TRICKLER))
    nexts = [d.request_id for d in of(plan(s, at(0)), SendNext)]
    assert nexts == [mine[0].id, flood[0].id]


def test_an_arrival_holds_back_the_planned_sends_of_other_keys_in_its_class():
    """A planned send of the same class is kept for an arrival of its own key (or with no
    keys at all), and dropped for another key's, which fair share may put first."""
    far = timezone.now() + timedelta(hours=1)
    for planned_key, arriving_key, kept in [(None, 0, True), (1, 1, True), (1, 2, False)]:
        rt = Runtime()
        planned = SendNext(1, uuid.uuid4(), 1, far, NORMAL, planned_key)
        rt.fast.install([planned], len(rt.fast.arrivals), {})
        rt.news(wakeup.Arrival(NORMAL, uuid.uuid4(), "", arriving_key))
        assert (rt.fast.next_send(1) is not None) == kept, (planned_key, arriving_key)


def test_a_tie_goes_to_the_key_with_less_waiting():
    """The trickler holds one of two slots, the flooder the other: their next requests tie.
    The slots that free next are planned before anyone knows whose frees first; if the
    trickler's own request ends first and the tie went to the older flood, the flooder
    would take the trickler's slot and the trickler would wait a whole inference more."""
    flood = ready(10, FLOODER, first_age_s=60)
    mine = ready(1, TRICKLER, first_age_s=0.1)
    s = snap([server(1, slots=2)], [dep(1, 1, "m", "loaded", in_flight=2)], flood + mine)
    s = with_keys(s, KeyView(FLOODER, processing=1), KeyView(TRICKLER, processing=1))
    nexts = [d.request_id for d in of(plan(s, at(0)), SendNext)]
    assert nexts == [mine[0].id, flood[0].id]
    # Equal backlogs: the line's own order, as before.
    two = ready(10, TRICKLER, first_age_s=30)
    s = snap([server(1, slots=2)], [dep(1, 1, "m", "loaded", in_flight=2)], flood + two)
    s = with_keys(s, KeyView(FLOODER, processing=1), KeyView(TRICKLER, processing=1))
    nexts = [d.request_id for d in of(plan(s, at(0)), SendNext)]
    assert nexts == [flood[0].id, two[0].id]


# -- teams ---------------------------------------------------------------------------------

TEAM = 10
A, B, C, SOLO = 11, 12, 13, 20


def test_a_team_shares_as_one_caller_however_many_keys_it_makes():
    """Three keys of one team flood the line; a key in no team has as much waiting. Four
    slots: two each. Breaks if each key of the team counted as a caller of its own (the
    team would take three of four)."""
    team = [r for key in (A, B, C) for r in ready(4, key, first_age_s=60 - key)]
    solo = ready(4, SOLO, first_age_s=30)
    s = snap([server(1, slots=4)], [dep(1, 1, "m", "loaded")], team + solo)
    keys = [KeyView(k, team=TEAM) for k in (A, B, C)] + [KeyView(SOLO)]
    s = with_keys(s, *keys, teams=(TeamView(TEAM),))
    sent = set(dispatched(plan(s, at(0))))
    assert len(sent & {r.id for r in solo}) == 2
    assert len(sent & {r.id for r in team}) == 2


def test_teams_share_by_weight_and_their_keys_by_theirs():
    """A team of weight 3 against a key of weight 1: three slots of four. Within the team,
    key A (weight 2) takes two of those for B's one (weight 1)."""
    a, b = ready(6, A, first_age_s=60), ready(6, B, first_age_s=50)
    solo = ready(6, SOLO, first_age_s=55)
    s = snap([server(1, slots=4)], [dep(1, 1, "m", "loaded")], a + b + solo)
    keys = (KeyView(A, weight=2, team=TEAM), KeyView(B, team=TEAM), KeyView(SOLO))
    s = with_keys(s, *keys, teams=(TeamView(TEAM, weight=3),))
    sent = set(dispatched(plan(s, at(0))))
    assert [len(sent & {r.id for r in line}) for line in (a, b, solo)] == [2, 1, 1]


def test_a_team_counts_the_slots_all_its_keys_hold():
    """Key A holds two slots, so its team does: B's request (the team's) waits behind the
    solo key's, though B holds none itself."""
    b = ready(1, B, first_age_s=60)
    solo = ready(1, SOLO, first_age_s=1)
    s = snap([server(1, slots=3)], [dep(1, 1, "m", "loaded", in_flight=2)], b + solo)
    keys = (KeyView(A, processing=2, team=TEAM), KeyView(B, team=TEAM), KeyView(SOLO))
    s = with_keys(s, *keys, teams=(TeamView(TEAM, processing=2),))
    assert dispatched(plan(s, at(0))) == [solo[0].id]


def test_a_team_at_its_quota_waits_while_others_use_the_free_slots():
    """The team may hold 3 slots and holds 2 (by key A): one request of key B goes, the
    rest wait with the team's quota as their reason, and the solo key takes the others."""
    b = ready(3, B, first_age_s=60)
    solo = ready(2, SOLO, first_age_s=1)
    s = snap([server(1, slots=6)], [dep(1, 1, "m", "loaded", in_flight=2)], b + solo)
    keys = (KeyView(A, processing=2, team=TEAM), KeyView(B, team=TEAM), KeyView(SOLO))
    s = with_keys(s, *keys, teams=(TeamView(TEAM, max_processing=3, processing=2),))
    decided = plan_explained(s, at(0))
    assert set(dispatched(decided.decisions)) == {b[0].id, solo[0].id, solo[1].id}
    assert decided.reasons[b[1].id].kind == reasons.QUOTA
    assert decided.reasons[b[1].id].text == "its team's quota is full (3 processing at once)"


def test_a_tie_in_a_team_goes_to_the_key_served_longest_ago():
    """A team held to one request at a time decides each turn with none of its keys holding
    a slot: their heads tie. The turn goes to the key served longest ago, so the keys take
    turns; by "fewer waiting" alone it went to the key just served (one fewer each time), and
    A's whole line ran before B was served at all."""
    a = ready(3, A, first_age_s=60)  # one of A's was just served: A has fewer waiting
    b = ready(4, B, first_age_s=59)
    team = (TeamView(TEAM, max_processing=1),)
    for a_served, b_served, first in [(7, 0, b), (7, 6, b), (5, 6, a)]:
        keys = (
            KeyView(A, team=TEAM, last_served=a_served),
            KeyView(B, team=TEAM, last_served=b_served),
        )
        line = snap([server(1, slots=4)], [dep(1, 1, "m", "loaded")], a + b)
        s = with_keys(line, *keys, teams=team)
        assert dispatched(plan(s, at(0))) == [first[0].id], (a_served, b_served)

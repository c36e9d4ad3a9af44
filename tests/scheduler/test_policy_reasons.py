"""Every wait has a reason (issue 34 item 6): one test per kind, on hand-built snapshots.

Pure: no database, no clock. Each test says what a caller would be left without if it broke.
"""

from dataclasses import replace

from scheduler import reasons
from scheduler.decisions import Dispatch, Requeue, StartLoad
from scheduler.policy import plan, plan_explained
from scheduler.reasons_shown import shown
from scheduler.snapshot import KeyView

from .builders import BACKGROUND, INTERACTIVE, NORMAL, at, dep, of, req, server, snap


def why(snapshot, now=None) -> dict:
    return plan_explained(snapshot, now or at(0)).reasons


def test_reasons_beside_the_same_decisions():
    """The reasons are additive: `plan_explained` decides exactly what `plan` decides."""
    s = snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [req("b"), req("a")])
    assert plan_explained(s, at(0)).decisions == plan(s, at(0))


def test_reason_loading_says_how_far_the_load_is():
    """A request waits for a load started 3.2 s ago that takes 4.5 s on average. Without it
    the page says "needs_loading" and nothing of when."""
    d = dep(1, 1, "gemma3-27b", "loading", load_started_at=at(-3.2), avg_load_s=4.5)
    r = req("gemma3-27b", state="needs_loading", deployment_id=1)
    reason = why(snap([server(1)], [d], [r]))[r.id]
    assert reason.kind == reasons.LOADING
    assert reason.text == "waiting for the load of gemma3-27b on s1 (~4.5 s)"
    assert reason.live(at(0)) == "waiting for the load of gemma3-27b on s1, 3.2 s of ~4.5 s"
    # A server that reports its own progress is believed over the estimate (the page's
    # bar shows its figure too).
    assert (
        reason.live(at(0), reported=1.0)
        == "waiting for the load of gemma3-27b on s1, 100% after 3.2 s, as the server reports"
    )
    # A load that runs past its estimate says so, not "7.0 s of ~4.5 s".
    assert reason.live(at(3.8)) == (
        "waiting for the load of gemma3-27b on s1, 7.0 s, past the ~4.5 s expected"
    )
    # The stored text stays the same as the load goes on: nothing to write pass after pass.
    assert why(snap([server(1)], [d], [r]), at(1))[r.id] == reason


def test_reason_loading_says_the_load_first_unloads_its_victim():
    """While its victim is still unloading (the server may first let what others run on it
    finish: `SWITCHYARD_OUTSIDE_GRACE_S`), the load says so, not "12.0 s, past the ~4.5 s
    expected" of a load that has not begun."""
    d = dep(1, 1, "gemma3-27b", "loading", load_started_at=at(-12), avg_load_s=4.5)
    victim = dep(2, 1, "qwen3-8b", "unloading")
    r = req("gemma3-27b", state="needs_loading", deployment_id=1)
    reason = why(snap([server(1)], [d, victim], [r]))[r.id]
    assert reason.text == (
        "waiting for the load of gemma3-27b on s1 (~4.5 s), which first unloads qwen3-8b"
    )
    assert reason.live(at(0)) == (
        "waiting for the load of gemma3-27b on s1, which first unloads qwen3-8b (12.0 s so far)"
    )
    # Once it is unloaded, the load's own progress.
    unloaded = why(snap([server(1)], [d, replace(victim, state="unloaded")], [r]))[r.id]
    assert unloaded.live(at(0)) == (
        "waiting for the load of gemma3-27b on s1, 12.0 s, past the ~4.5 s expected"
    )


def test_a_load_under_a_tenth_of_a_second_reads_in_ms():
    """A tiny model's load, not "0.0 s of ~0.1 s"."""
    d = dep(1, 1, "tiny", "loading", load_started_at=at(-0.046), avg_load_s=0.052)
    r = req("tiny", state="needs_loading", deployment_id=1)
    reason = why(snap([server(1)], [d], [r]))[r.id]
    assert reason.text == "waiting for the load of tiny on s1 (~52 ms)"
    assert reason.live(at(0)) == "waiting for the load of tiny on s1, 46 ms of ~52 ms"


def test_reason_loading_for_a_load_this_pass_starts():
    r = req("a")
    decided = plan_explained(snap([server(1)], [dep(1, 1, "a")], [r]), at(0))
    assert of(decided.decisions, StartLoad) == [StartLoad(1, (), "1 waiting, normal first")]
    assert decided.reasons[r.id].live(at(2)) == "waiting for the load of a on s1, 2.0 s of ~10.0 s"


def test_a_load_says_how_many_it_is_for_and_the_best_of_them():
    """The worker logs a load with its decision's reason: an operator reads who it was
    for, not only that the model was asked for."""
    line = [req("a", BACKGROUND, age_s=9), req("a", INTERACTIVE, age_s=1), req("a", NORMAL)]
    decided = plan(snap([server(1)], [dep(1, 1, "a")], line), at(0))
    assert of(decided, StartLoad) == [StartLoad(1, (), "3 waiting, interactive first")]


def test_reason_loading_counts_from_this_load_not_the_last_one():
    """The deployment still carries the start of its previous load (an hour ago): the
    reason counts from the load this pass starts. Breaks if the page says "95% after
    3600 s" of a load that just began."""
    r = req("a")
    d = dep(1, 1, "a", load_started_at=at(-3600))
    decided = plan_explained(snap([server(1)], [d], [r]), at(0))
    assert decided.reasons[r.id].detail("started_at") == at(0)


def test_reason_behind_counts_the_requests_ahead_by_class():
    """Three interactive requests are ahead of a normal one for s1's one busy slot."""
    ahead = [req("a", INTERACTIVE, age_s=3 - i, state="ready", deployment_id=1) for i in range(3)]
    mine = req("a", NORMAL, age_s=10, state="ready", deployment_id=1)
    found = why(snap([server(1)], [dep(1, 1, "a", "loaded", in_flight=1)], [*ahead, mine]))
    assert found[mine.id].kind == reasons.BEHIND
    assert found[mine.id].text == "behind 3 interactive requests on s1"
    assert found[ahead[0].id].text == "next for a slot on s1"
    assert found[ahead[2].id].text == "behind 2 interactive requests on s1"


def test_reason_behind_mixed_classes_and_a_long_line_by_steps():
    """A long line moving forward changes (and stores) few reasons: past 10, by steps."""
    line = [req("a", INTERACTIVE, age_s=100 - i, state="ready", deployment_id=1) for i in range(2)]
    line += [req("a", NORMAL, age_s=90 - i, state="ready", deployment_id=1) for i in range(30)]
    found = why(snap([server(1)], [dep(1, 1, "a", "loaded", in_flight=1)], line))
    assert found[line[4].id].text == "behind 4 requests on s1 (2 interactive, 2 normal)"
    assert found[line[11].id].text == "behind 10+ requests on s1"
    assert found[line[25].id].text == "behind 20+ requests on s1"
    assert found[line[25].id].detail("ahead") == 20


def test_reason_held_switch_batching_says_until_when_and_what_it_saves():
    """The priced hold of switch batching (holding.py): until the batch has paid a load."""
    from .test_policy_holds import busy_homes_for_b

    r = req("b", NORMAL, age_s=4)
    found = why(snap([server(1, llm=2), server(2, llm=2)], busy_homes_for_b(), [r]))
    assert found[r.id].kind == reasons.HELD
    assert found[r.id].text == "held: switch on s1 batched until 12:00:06, saves a load of 10 s"
    assert found[r.id].detail("until") == at(6)


def test_reason_held_by_a_guard_window():
    """Interactive work used A 10 s ago: a normal switch evicting it is held (warm)."""
    warm = dep(1, 1, "a", "loaded", last_interactive_at=at(-10))
    r = req("b", NORMAL)
    found = why(snap([server(1)], [warm, dep(2, 1, "b")], [r]))
    # A's reload and B's run (10 s each, not yet measured) at the interactive weight, paid
    # at the normal one: 80 s, past the normal window's end.
    assert found[r.id].text == "held: switch on s1 keeps a for interactive work until 12:00:50"


def test_reason_held_by_minimum_residency():
    a = dep(
        1,
        1,
        "a",
        "loaded",
        loaded_at=at(-10),
        last_used_at=at(-1),
        last_priority=NORMAL,
        avg_load_s=60.0,
    )
    r = req("b", BACKGROUND)
    found = why(snap([server(1)], [a, dep(2, 1, "b")], [r]))
    assert found[r.id].text == "held: a on s1 keeps its minimum residency until 12:00:20"


def test_reason_held_by_no_wasted_load():
    """A finished 5 s ago for requests that waited for it: an interactive request for B
    waits for them to be served first (scheduler/README.md, "No wasted load")."""
    fresh = dep(1, 1, "a", "loaded", loaded_at=at(-5), avg_load_s=3.0)
    batch = [req("a", NORMAL, age_s=70 - i, state="ready", deployment_id=1) for i in range(2)]
    ia = req("b", INTERACTIVE, age_s=160)
    found = why(snap([server(1)], [fresh, dep(2, 1, "b")], [*batch, ia]))
    assert found[ia.id].text == "held: a on s1 first serves the 2 requests that waited for its load"
    # A count past 10 by steps: each one served does not rewrite every held reason.
    assert [reasons.about(n) for n in (1, 10, 11, 57, 148)] == ["1", "10", "10+", "50+", "100+"]


def test_reason_collation_for_an_idle_model_with_a_queue():
    """Requests queue for A (ready, not yet sent: backing off); B of the same class waits."""
    queue = [req("a", NORMAL, age_s=5, state="ready", deployment_id=1, not_before=at(3))]
    b = req("b", NORMAL, age_s=1)
    found = why(snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [*queue, b]))
    assert found[b.id].text == "held: a on s1 serves the requests waiting for it first"
    assert found[queue[0].id].kind == reasons.RETRY
    assert found[queue[0].id].text == "a retry, sent after 12:00:03"


def test_reason_no_server_names_the_servers_and_the_deadline():
    servers = [server(1, health="down"), server(2, enabled=False)]
    r = req("a", INTERACTIVE, age_s=5)
    found = why(snap(servers, [dep(1, 1, "a"), dep(2, 2, "a")], [r]))
    assert found[r.id].kind == reasons.NO_SERVER
    assert found[r.id].text == (
        "no server can serve a: s1 is down; s2 is disabled; fails at 12:00:10 unless one comes back"
    )


def test_reason_no_room_while_another_load_is_under_way():
    """s1 loads c; b must wait for that load to end before its own can start."""
    deployments = [dep(1, 1, "c", "loading"), dep(2, 1, "b")]
    r = req("b")
    found = why(snap([server(1, llm=2)], deployments, [r]))
    assert found[r.id].kind == reasons.NO_ROOM
    assert found[r.id].text == "no load of b can start now: another load is under way on s1"
    assert found[r.id].detail("server") == "s1"  # its one home: the trace names it


def test_reason_no_room_names_no_server_when_several_could_load_it():
    deployments = [dep(1, 1, "c", "loading"), dep(2, 1, "b"), dep(3, 2, "d", "loading")]
    deployments.append(dep(4, 2, "b"))
    r = req("b")
    found = why(snap([server(1, llm=2), server(2, llm=2)], deployments, [r]))
    assert found[r.id].kind == reasons.NO_ROOM
    assert found[r.id].detail("server") is None


def test_reason_no_room_is_shared_by_the_line_behind_its_head():
    """A deep line for a model that no server can take now is asked once (`held_back`): the
    requests behind the first get its reason, not none."""
    a = dep(1, 1, "a", "loaded", in_flight=1)
    line = [req("b", NORMAL, age_s=10 - i) for i in range(3)]
    found = why(snap([server(1)], [a, dep(2, 1, "b")], line))
    texts = {found[r.id].text for r in line}
    assert texts == {"no load of b can start now: s1 first finishes the 1 running on a"}


def test_reason_quota_of_the_key():
    mine = req("a", state="ready", deployment_id=1, api_key=7)
    s = replace(
        snap([server(1, slots=4)], [dep(1, 1, "a", "loaded", in_flight=2)], [mine]),
        keys=(KeyView(7, max_processing=2, processing=2),),
    )
    decided = plan_explained(s, at(0))
    assert of(decided.decisions, Dispatch) == []
    assert decided.reasons[mine.id].kind == reasons.QUOTA
    assert decided.reasons[mine.id].text == "its API key's quota is full (2 processing at once)"


def test_reason_evicted_by_our_own_eviction():
    """The wording the trace has: the request was sent back by our own switch."""
    queued = req("a", NORMAL, age_s=5, state="ready", deployment_id=1)
    ia = req("b", INTERACTIVE)
    decided = plan_explained(
        snap([server(1)], [dep(1, 1, "a", "loaded"), dep(2, 1, "b")], [queued, ia]), at(0)
    )
    assert of(decided.decisions, Requeue) == [
        Requeue(queued.id, "evicted from s1 for b (interactive)", 1)
    ]
    assert decided.reasons[queued.id] == reasons.Reason(
        reasons.EVICTED, "evicted from s1 for b (interactive)"
    )


def test_reason_none_for_requests_sent_expired_or_failed():
    """Only requests left waiting have one."""
    sent = req("a", state="ready", deployment_id=1)
    expired = req("a", BACKGROUND, expires_at=at(-1))
    lost = req("nowhere")
    found = why(snap([server(1)], [dep(1, 1, "a", "loaded")], [sent, expired, lost]))
    assert found == {}


def test_reason_as_json_and_live_text_of_a_stored_one():
    reason = reasons.make(
        reasons.LOADING, "x", model="m", server="s1", started_at=at(-1), expected_s=9.0
    )
    stored = reason.as_json()
    assert stored["details"]["started_at"] == at(-1).isoformat()
    live = reasons.live_text(stored["kind"], stored["text"], stored["details"], at(2))
    assert live == "waiting for the load of m on s1, 3.0 s of ~9.0 s"


def test_reason_as_shown_while_waiting_and_for_a_tail_no_pass_reached():
    stored = reasons.make(reasons.HELD, "held: x").as_json()
    assert shown(stored, "ready", at(0))["text"] == "held: x"
    assert shown(stored, "processing", at(0)) is None
    assert shown(None, "pending", at(0)) is None
    tail = shown(None, "pending", at(0), ahead=812)
    assert (tail["kind"], tail["text"]) == ("behind", "behind 812 requests in line")
    first = shown(None, "pending", at(0), ahead=0)  # not "behind 0 requests"
    assert (first["kind"], first["text"]) == ("waiting", "waiting to be placed")

"""The ETA forecast, pure: snapshots by hand, seconds out."""

import pytest

from scheduler.eta import (
    Cap,
    Host,
    Place,
    Waiter,
    forecast,
    line_order,
    load_left_s,
    token_line,
)
from scheduler.eta_accuracy import Accuracy, within


def place(id, server, model, state="loaded", **fields) -> Place:
    fields.setdefault("load_s", 10.0)
    fields.setdefault("run_s", 2.0)
    return Place(id=id, server_id=server, model=model, state=state, **fields)


def test_a_token_line_parts_the_prompt_from_the_tokens():
    # 2 s before the first token, 0.02 s a token.
    assert token_line([(4.0, 100), (8.0, 300), (6.0, 200)]) == pytest.approx((2.0, 0.02))
    assert token_line([(4.0, 100), (4.0, 100)]) is None  # one count: cannot be told apart
    assert token_line([]) is None
    # Longer answers that ran shorter: no time per token, the mean run.
    assert token_line([(8.0, 100), (4.0, 300)]) == (6.0, 0.0)
    # A line that would start below 0 goes through 0: 1 s for 100, 4 s for 200.
    base_s, token_s = token_line([(1.0, 100), (4.0, 200)])
    assert base_s == 0.0 and token_s == pytest.approx((100 + 800) / (100**2 + 200**2))


def test_a_waiter_runs_as_it_is_expected_to_else_as_its_place():
    p = place(1, 1, "a", run_s=10.0)
    assert Waiter(1, "a").run_on(p) == 10.0
    assert Waiter(1, "a", run_s=2.5).run_on(p) == 2.5
    etas = forecast(
        [Host(1, slots=1)], [p], [Waiter(1, "a", run_s=1.0), Waiter(2, "a"), Waiter(3, "a")]
    )
    assert etas == {1: 0.0, 2: 1.0, 3: 11.0}


def test_a_loaded_model_with_free_slots_is_sent_at_once_then_rounds_of_its_run():
    etas = forecast([Host(1, slots=2)], [place(1, 1, "a")], [Waiter(i, "a") for i in range(5)])
    assert etas == {0: 0.0, 1: 0.0, 2: 2.0, 3: 2.0, 4: 4.0}


def test_a_request_held_by_its_callers_quota_goes_once_a_unit_of_it_frees():
    """A team held to 2 at once runs one request with 3 s left: of its three waiting, the
    first goes now, the next two as the team's requests end, though the server has free
    slots (without, all three 'any moment'). A key's own quota counts too; another caller's
    request goes at once."""
    team = Cap("team", limit=2, busy_s=(3.0,))
    line = [Waiter(i, "a", caps=("team",)) for i in range(3)] + [Waiter("other", "a")]
    etas = forecast([Host(1, slots=8)], [place(1, 1, "a")], line, caps=[team])
    assert etas == {0: 0.0, 1: 2.0, 2: 3.0, "other": 0.0}
    key = Cap("key", limit=1)
    line = [Waiter(i, "a", caps=("key", "team")) for i in range(2)]
    etas = forecast([Host(1, slots=8)], [place(1, 1, "a")], line, caps=[team, key])
    assert etas == {0: 0.0, 1: 2.0}


def test_a_load_under_way_does_not_hold_up_a_loaded_models_requests():
    places = [place(1, 1, "a"), place(2, 1, "b", state="loading", load_left_s=6.0, run_s=3.0)]
    line = [Waiter("b1", "b", 2), Waiter("a1", "a"), Waiter("a2", "a"), Waiter("a3", "a")]
    etas = forecast([Host(1, capacity={"llm": 2})], places, line)
    assert etas == {"b1": 6.0, "a1": 0.0, "a2": 2.0, "a3": 4.0}


def test_a_model_nowhere_is_loaded_evicting_the_least_recently_used_once_idle():
    places = [
        place(1, 1, "a", busy_s=(3.0,), idle_s=0.0),
        place(2, 1, "b", idle_s=50.0),
        place(3, 1, "c", state="unloaded", load_s=8.0),
    ]
    etas = forecast([Host(1, slots=2, capacity={"llm": 2})], places, [Waiter("c1", "c")], 1.0)
    assert etas == {"c1": 1.0 + 8.0}  # b goes (idle, unused longest): unload 1 s, load 8 s


def test_a_count_in_all_has_a_model_of_another_type_leave_first():
    """With room for one model in all (a router's --models-max 1), an embedding model waits
    for the LLM's run and its unload, though the embedding type has room of its own."""
    places = [
        place(1, 1, "a", busy_s=(3.0,)),
        place(2, 1, "e", state="unloaded", load_s=2.0, model_type="embedding"),
    ]
    roomy = Host(1, slots=2, capacity={"llm": 1, "embedding": 1})
    assert forecast([roomy], places, [Waiter("e1", "e")], 1.0) == {"e1": 2.0}
    one_in_all = Host(1, slots=2, capacity={"llm": 1, "embedding": 1}, max_models=1)
    assert forecast([one_in_all], places, [Waiter("e1", "e")], 1.0) == {"e1": 3.0 + 1.0 + 2.0}


def test_requests_go_where_their_model_is_rather_than_start_a_load():
    places = [place(1, 1, "a"), place(2, 2, "a", state="unloaded")]
    etas = forecast([Host(1), Host(2)], places, [Waiter(i, "a") for i in range(3)])
    assert etas == {0: 0.0, 1: 2.0, 2: 4.0}


def test_no_available_server_means_no_eta():
    places = [place(1, 1, "a")]
    etas = forecast([Host(1, available=False)], places, [Waiter("x", "a"), Waiter("y", "z")])
    assert etas == {"x": None, "y": None}


def test_a_waiters_own_expected_run_counts_for_those_behind_it():
    etas = forecast([Host(1)], [place(1, 1, "a")], [Waiter(1, "a", run_s=30.0), Waiter(2, "a")])
    assert etas == {1: 0.0, 2: 30.0}


def test_a_held_request_is_not_sent_before_its_hold_ends_and_others_go_meanwhile():
    """The policy holds a request (its reason says until when): a free slot does not send
    it sooner, and the request behind it takes the slot."""
    line = [Waiter("held", "a", not_before_s=7.0), Waiter("next", "a")]
    etas = forecast([Host(1)], [place(1, 1, "a")], line)
    assert etas == {"held": 7.0, "next": 0.0}


def test_a_held_switch_loads_once_the_hold_ends():
    places = [place(1, 1, "a", idle_s=5.0), place(2, 1, "b", state="unloaded", load_s=8.0)]
    line = [Waiter("b1", "b", not_before_s=20.0)]
    assert forecast([Host(1)], places, line, unload_s=1.0) == {"b1": 20.0 + 1.0 + 8.0}


def test_a_hold_that_ends_before_the_model_is_ready_changes_nothing():
    places = [place(1, 1, "a", state="loading", load_left_s=6.0)]
    assert forecast([Host(1)], places, [Waiter("x", "a", not_before_s=2.0)]) == {"x": 6.0}


def test_aging_moves_a_request_up_one_class_per_step():
    assert line_order(3, 299.0, 150.0) == 2
    assert line_order(3, 1000.0, 150.0) == 0
    assert line_order(2, 1000.0, 0.0) == 2


def test_accuracy_counts_within_twenty_percent_or_a_second():
    assert within(10.0, 12.0) and within(10.0, 8.0) and not within(10.0, 12.5)
    assert within(0.0, 0.9) and not within(0.0, 1.5)
    a = Accuracy()
    for eta, actual in ((10, 11), (10, 20), (0, 0), (100, 70)):
        a.add(eta, actual)
    assert (a.checked, a.within, a.share) == (4, 2, 0.5)
    assert a.median_error_s == 1.0  # |errors| 0, 1, 10, 30: the lower middle
    assert a.summary() == "50% within ±20% (or 1 s) of 4, median error 1.0 s"


def test_a_load_under_way_is_counted_by_its_servers_own_figure_when_it_gives_one():
    # A first load estimated at 10 s that the server says is a quarter done after 5 s
    # has 15 s to go, not 5; without a figure, the estimate less the time so far.
    assert load_left_s(10.0, 5.0, 0.25) == 15.0
    assert load_left_s(10.0, 5.0) == 5.0
    assert load_left_s(10.0, 15.0) == 0.0  # past its estimate: any moment
    assert load_left_s(10.0, 30.0, 0.75) == 10.0
    assert load_left_s(10.0, 5.0, 1.0) == 0.0
    assert load_left_s(10.0, 0.5, 0.01) == 9.5  # a first tick says too little to scale from


def test_a_request_routed_to_a_load_is_sent_on_it_though_a_switch_is_placed_ahead_of_it():
    # `a` loads on a server that holds one LLM; `b` waits between two requests that joined
    # the load. The policy serves both of them before `a` can leave; then `b` is loaded.
    places = [
        place(1, 1, "a", state="loading", load_left_s=8.0, run_s=0.5),
        place(2, 1, "b", state="unloaded", load_s=2.0),
    ]
    line = [Waiter("a1", "a", 1), Waiter("b1", "b"), Waiter("a2", "a", 1)]
    etas = forecast([Host(1, slots=2)], places, line)
    assert etas == {"a1": 8.0, "b1": 8.5 + 2.0, "a2": 8.0}


def test_a_model_with_fewer_slots_than_its_server_runs_no_more_at_once():
    """llama-server's `-np 2` on a server of 4: two at once, and the other model's requests
    take the free slots meanwhile."""
    places = [place(1, 1, "a", slots=2, busy_s=(1.0,)), place(2, 1, "b")]
    line = [Waiter(f"a{i}", "a") for i in range(4)] + [Waiter("b1", "b")]
    etas = forecast([Host(1, slots=4, capacity={"llm": 2})], places, line)
    assert etas == {"a0": 0.0, "a1": 1.0, "a2": 2.0, "a3": 3.0, "b1": 0.0}


def test_an_eviction_waits_for_the_models_own_slots_to_serve_what_waited_for_it():
    """`a` (2 slots of the server's 4) keeps 8 routed requests of 2 s before it can leave:
    `b` is loaded after 8 s, not 4."""
    places = [place(1, 1, "a", slots=2), place(2, 1, "b", state="unloaded", load_s=1.0)]
    line = [Waiter("b1", "b")] + [Waiter(f"a{i}", "a", 1) for i in range(8)]
    etas = forecast([Host(1, slots=4)], places, line)
    assert etas["b1"] == 8.0 + 1.0
    assert [etas[f"a{i}"] for i in range(8)] == [0.0, 0.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0]


def test_a_better_class_that_outranks_a_models_routed_requests_goes_first_as_the_policy_sends():
    """Interactive `b1` and four background requests routed to the loaded `a`: with cheap
    loads the policy's priced collation evicts `a` once its running request ends, and the
    four wait for `b1`'s load and run and `a`'s reload. With a 90 s reload of `a` it does not,
    and `b1` waits for them as before."""

    def etas(a_load_s: float) -> dict:
        places = [
            place(1, 1, "a", slots=2, busy_s=(1.0,), load_s=a_load_s),
            place(2, 1, "b", state="unloaded", load_s=1.0),
        ]
        line = [Waiter("b1", "b", effective_class=0)] + [
            Waiter(f"a{i}", "a", 1, effective_class=3) for i in range(4)
        ]
        return forecast([Host(1, slots=4)], places, line)

    # b: loaded 1.0 to 2.0, runs to 4.0 (2 s); a: reloaded from 2.5 (b's share of the
    # server's work), ready at 3.5, two at a time.
    assert etas(1.0) == {"b1": 2.0, "a0": 3.5, "a1": 3.5, "a2": 5.5, "a3": 5.5}
    kept = etas(90.0)
    assert [kept[f"a{i}"] for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert kept["b1"] == 5.0 + 1.0  # after a's last run (3.0 + 2.0), then its own load


def test_a_loaded_models_own_queue_is_served_before_an_equal_class_switch():
    """`b1` arrived first, but `a` is loaded with four requests of the same class waiting:
    at equal classes the policy never evicts a model with a queue (collation), so they are
    sent on `a` first and `b` is loaded once they have run."""
    places = [place(1, 1, "a"), place(2, 1, "b", state="unloaded", load_s=1.0)]
    line = [Waiter("b1", "b", effective_class=3)] + [
        Waiter(f"a{i}", "a", effective_class=3) for i in range(4)
    ]
    etas = forecast([Host(1, slots=2)], places, line)
    assert etas == {"a0": 0.0, "a1": 0.0, "a2": 2.0, "a3": 2.0, "b1": 4.0 + 1.0}


def test_a_switch_waits_for_the_head_of_the_queue_its_batch_does_not_outrank():
    """Interactive `b1` against `a`'s queue of five interactive and two background requests:
    the policy weighs collation again as the queue drains, so `b` is loaded once the five
    have run, and the two background requests wait for its run and `a`'s reload."""
    places = [place(1, 1, "a", load_s=1.0), place(2, 1, "b", state="unloaded", load_s=1.0)]
    line = [
        Waiter("b1", "b", effective_class=0),
        *(Waiter(f"a{i}", "a", effective_class=0) for i in range(5)),
        *(Waiter(f"a{i}", "a", effective_class=3) for i in (5, 6)),
    ]
    etas = forecast([Host(1, slots=2)], places, line)
    assert etas == {
        "a0": 0.0, "a1": 0.0, "a2": 2.0, "a3": 2.0, "a4": 4.0,
        "b1": 5.0 + 1.0,  # a4's run shares the server's two slots: a gone at 5.0
        "a5": 8.0, "a6": 8.0,  # b ready at 6.0, its run's share to 7.0, a's reload to 8.0
    }  # fmt: skip


def test_a_model_loaded_and_not_used_yet_serves_one_of_its_queue_before_it_is_outranked():
    """As the policy's no wasted load: `a` finished its load and has served nothing, so the
    first of its background queue goes before interactive `b1`'s load, the rest after."""

    def etas(fresh: bool) -> dict:
        places = [
            place(1, 1, "a", load_s=1.0, fresh=fresh),
            place(2, 1, "b", state="unloaded", load_s=1.0),
        ]
        line = [Waiter("b1", "b", effective_class=0)] + [
            Waiter(f"a{i}", "a", 1, effective_class=3) for i in range(3)
        ]
        return forecast([Host(1, slots=1)], places, line)

    assert etas(False) == {"b1": 1.0, "a0": 4.0, "a1": 6.0, "a2": 8.0}
    assert etas(True) == {"a0": 0.0, "b1": 3.0, "a1": 6.0, "a2": 8.0}

"""A model's own slots on a server (`Deployment.slots`: llama-server's --parallel, Ollama's
OLLAMA_NUM_PARALLEL): the policy never sends a model more at once than they allow, while
the server's other slots serve its other models. Pure: no database, no clock."""

from scheduler.decisions import Dispatch, SendNext, SendOnArrival, StartLoad
from scheduler.policy import plan, plan_explained

from .builders import NORMAL, at, dep, of, req, server, snap


def ready(model: str, deployment_id: int, n: int, first_age_s: float = 10) -> list:
    return [
        req(model, NORMAL, age_s=first_age_s - i, state="ready", deployment_id=deployment_id)
        for i in range(n)
    ]


def sent(decisions) -> list:
    return [(d.request_id, d.deployment_id) for d in of(decisions, Dispatch)]


def test_a_model_takes_no_more_than_its_own_slots_and_the_rest_serve_others():
    """4 slots on s1; `big` may run 1 at once. Three `big` requests and one `small`: one
    `big` and the `small` go, two `big` wait with the model's own slots as their reason.
    Breaks if `big` took the server's free slots (the server would queue them itself, or
    run out of memory)."""
    big = ready("big", 1, 3)
    small = ready("small", 2, 1, first_age_s=1)
    s = snap(
        [server(1, slots=4, llm=2)],
        [dep(1, 1, "big", "loaded", slots=1), dep(2, 1, "small", "loaded")],
        big + small,
    )
    decided = plan_explained(s, at(0))
    assert sent(decided.decisions) == [(big[0].id, 1), (small[0].id, 2)]
    assert decided.reasons[big[1].id].text == "next for a slot for big on s1 (1 at once)"
    assert decided.reasons[big[2].id].text == "behind 1 normal request for big on s1 (1 at once)"


def test_its_slots_count_what_is_already_in_flight():
    big = ready("big", 1, 2)
    s = snap([server(1, slots=4)], [dep(1, 1, "big", "loaded", slots=2, in_flight=1)], big)
    assert sent(plan(s, at(0))) == [(big[0].id, 1)]


def test_a_full_model_drains_onto_another_server_that_holds_it():
    line = ready("big", 1, 2)
    s = snap(
        [server(1, slots=4), server(2, slots=1)],
        [dep(1, 1, "big", "loaded", slots=1), dep(2, 2, "big", "loaded")],
        line,
    )
    assert sent(plan(s, at(0))) == [(line[0].id, 1), (line[1].id, 2)]


def test_send_on_arrival_has_only_the_room_its_model_leaves():
    s = snap([server(1, slots=4)], [dep(1, 1, "big", "loaded", slots=2, in_flight=1)], [])
    assert [(d.model, d.room) for d in of(plan(s, at(0)), SendOnArrival)] == [("big", 1)]
    full = snap([server(1, slots=4)], [dep(1, 1, "big", "loaded", slots=2, in_flight=2)], [])
    assert of(plan(full, at(0)), SendOnArrival) == []


def test_send_next_plans_no_more_for_a_model_than_its_slots():
    """s1 is full (2 slots: `big` holds 1 of its 1, `small` 1). Of three `big` waiting, one
    is planned for the slots that free next: a second could only go once the first ends."""
    big = ready("big", 1, 3)
    s = snap(
        [server(1, slots=2, llm=2)],
        [
            dep(1, 1, "big", "loaded", slots=1, in_flight=1),
            dep(2, 1, "small", "loaded", in_flight=1),
        ],
        big,
    )
    assert [d.request_id for d in of(plan(s, at(0)), SendNext)] == [big[0].id]


def test_a_long_queue_at_its_models_own_slots_loads_it_on_another_server():
    """s1 has 7 slots free but `big` serves one at a time there: with its queue long
    enough, the next request loads `big` on the idle s2 as it would beside a busy server.
    Breaks if only a full server counted as busy (the queue would drain one at a time)."""
    line = [*ready("big", 1, 3), req("big", NORMAL)]
    s = snap(
        [server(1, slots=8), server(2, slots=1)],
        [dep(1, 1, "big", "loaded", slots=1, in_flight=1), dep(2, 2, "big")],
        line,
    )
    assert [d.deployment_id for d in of(plan(s, at(0)), StartLoad)] == [2]

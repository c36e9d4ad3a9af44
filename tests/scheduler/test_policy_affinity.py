"""Prompt-cache affinity, the policy's side (scheduler/README.md, "Prompt-cache affinity"):
a request goes to the server where its conversation's last turn ran while that server has
a free slot, and otherwise as any other request would; a load that could go to either of
two servers alike goes there. Pure: hand-built snapshots."""

from scheduler.decisions import Dispatch, Route, StartLoad
from scheduler.policy import plan

from .builders import at, dep, of, req, server, snap


def routes(decisions) -> list[tuple[int, str]]:
    return [(d.deployment_id, d.reason) for d in of(decisions, Route)]


def test_a_conversation_goes_back_to_the_server_of_its_last_turn():
    """Both servers idle: s2, where it last ran, though s1 sorts first. Breaks if the
    preference were dropped (least busy alone picks s1)."""
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "a", "loaded")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 2)]
    assert routes(decisions) == [
        (2, "model loaded there, where its conversation's last turn ran (s2)")
    ]


def test_without_a_last_turn_the_least_busy_server_is_chosen():
    r = req("a")
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "a", "loaded")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 1)]
    assert routes(decisions) == [(1, "model loaded there (s1)")]


def test_a_free_slot_on_the_last_server_wins_over_an_idler_one():
    """s2 has one of its two slots busy, s1 is idle: s2 still has room, so it goes there."""
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "a", "loaded", in_flight=1)]
    decisions = plan(snap([server(1), server(2, slots=2)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 2)]


def test_affinity_never_makes_a_request_wait_for_a_slot():
    """Its last server is busy and another has the model free: it goes there at once.
    Breaks if affinity queued it behind the busy slot."""
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "a", "loaded", in_flight=1)]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 1)]


def test_requests_routed_there_already_count_against_the_free_slot():
    """s2's one slot is promised to a request routed there before: the new turn goes to the
    free s1 rather than queue behind it."""
    first = req("a", state="ready", deployment_id=2, age_s=5)
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a", "loaded", in_flight=1), dep(2, 2, "a", "loaded", in_flight=1)]
    servers = [server(1, slots=2), server(2, slots=2)]
    decisions = plan(snap(servers, deployments, [first, r]), at(0))
    assert routes(decisions)[-1] == (1, "model loaded there (s1)")


def test_a_last_server_without_the_model_loaded_starts_no_load():
    """Its model has left s2: it goes where the model is loaded, and nothing is loaded for
    it on s2."""
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a", "loaded"), dep(2, 2, "a")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 1)]
    assert of(decisions, StartLoad) == []


def test_a_load_that_could_go_anywhere_goes_where_its_conversation_last_ran():
    """Its model is loaded nowhere and both servers are empty alike: the load goes to s2,
    where a server that saved its slots' caches restores them. Breaks if the tie went to
    the lower id as before."""
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a"), dep(2, 2, "a")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert [d.deployment_id for d in of(decisions, StartLoad)] == [2]


def test_the_conversation_only_breaks_ties_between_loads():
    """s2 would have to evict a model to load it, s1 has room: s1, though the conversation
    last ran on s2 (an eviction costs a reload; a cache is only a chance)."""
    r = req("a", cache_server=2)
    deployments = [dep(1, 1, "a"), dep(2, 2, "a"), dep(3, 2, "x", "loaded")]
    decisions = plan(snap([server(1), server(2)], deployments, [r]), at(0))
    assert [d.deployment_id for d in of(decisions, StartLoad)] == [1]


def test_a_queue_drains_onto_the_conversations_last_server_first():
    """Queued behind s3's busy slot, it may drain onto s1 or s2, both free: s2, where its
    conversation last ran. Breaks if the drain took the lowest id (s1)."""
    r = req("a", state="ready", deployment_id=3, cache_server=2)
    deployments = [
        dep(1, 1, "a", "loaded"),
        dep(2, 2, "a", "loaded"),
        dep(3, 3, "a", "loaded", in_flight=1),
    ]
    decisions = plan(snap([server(1), server(2), server(3)], deployments, [r]), at(0))
    assert of(decisions, Dispatch) == [Dispatch(r.id, 2)]

"""The pure eviction function: which models leave a server so another fits. No database."""

from scheduler.eviction import NoRoom, evictions_for, keep_value
from scheduler.snapshot import ServerView

from .builders import at, dep, server

NOW = at(0)


def evict(target, srv, resident, may_evict=lambda _: True):
    return evictions_for(target, srv, resident, NOW, may_evict)


def test_keep_value_is_reload_cost_over_idleness():
    """keep_value = expected load seconds / idle seconds (at least 1); breaks if the formula
    in the docs and the code drift apart."""
    d = dep(1, 1, "a", "loaded", avg_load_s=90.0, last_used_at=at(-30))
    assert keep_value(d, NOW, 10.0) == 3.0
    never_measured = dep(2, 1, "b", "loaded", last_used_at=at(-5))
    assert keep_value(never_measured, NOW, 10.0) == 2.0
    just_used = dep(3, 1, "c", "loaded", avg_load_s=4.0, last_used_at=at(0))
    assert keep_value(just_used, NOW, 10.0) == 4.0


def test_free_room_evicts_nothing():
    """Capacity left: the answer is the empty tuple, not a needless eviction."""
    assert evict(dep(2, 1, "b"), server(1, llm=2), [dep(1, 1, "a", "loaded")]) == ()


def test_least_recently_used_goes_first_at_equal_load_cost():
    """Breaks if eviction ignored idleness and threw out the model used a moment ago."""
    old = dep(1, 1, "a", "loaded", last_used_at=at(-900))
    recent = dep(2, 1, "b", "loaded", last_used_at=at(-10))
    assert evict(dep(3, 1, "c"), server(1, llm=2), [recent, old]) == (1,)


def test_expensive_reload_is_kept_over_cheap_one_at_equal_idleness():
    """A 90 s model outvalues a 3 s model idle as long; breaks if load cost were ignored."""
    slow = dep(1, 1, "slow", "loaded", avg_load_s=90.0, last_used_at=at(-300))
    fast = dep(2, 1, "fast", "loaded", avg_load_s=3.0, last_used_at=at(-300))
    assert evict(dep(3, 1, "c"), server(1, llm=2), [slow, fast]) == (2,)


def test_capacity_is_counted_per_model_type():
    """An embedding model does not take an LLM's place; breaks if types shared one count."""
    emb = dep(1, 1, "emb", "loaded", model_type="embedding", last_used_at=at(-9000))
    llm = dep(2, 1, "a", "loaded")
    assert evict(dep(3, 1, "b"), server(1), [emb, llm]) == (2,)
    assert evict(dep(4, 1, "emb2", model_type="embedding"), server(1), [emb, llm]) == (1,)


def test_a_count_in_all_evicts_a_model_of_any_type():
    """A router at --models-max counts every model alike: with room for one in all, an
    embedding model makes an idle LLM go though each type has room of its own. Breaks if
    `max_models` were ignored (the router would then stop a model behind our back)."""
    llm = dep(1, 1, "a", "loaded")
    srv = server(1, max_models=1)
    assert evict(dep(2, 1, "emb", model_type="embedding"), srv, [llm]) == (1,)
    assert evict(dep(2, 1, "emb", model_type="embedding"), server(1), [llm]) == ()
    # Within the count in all, each type's own count still holds.
    assert evict(dep(3, 1, "b"), server(1, max_models=3), [llm]) == (1,)


def test_a_count_in_all_takes_the_cheapest_of_any_type_and_no_more():
    """Over the count in all by one: the least valuable model goes, whatever its type, and
    only one."""
    stale_emb = dep(1, 1, "emb", "loaded", model_type="embedding", last_used_at=at(-9000))
    llm = dep(2, 1, "a", "loaded", last_used_at=at(-10))
    srv = server(1, llm=2, max_models=2)
    assert evict(dep(3, 1, "b"), srv, [stale_emb, llm]) == (1,)


def test_a_count_in_all_waits_for_a_busy_model_of_another_type():
    """The one model the router may run is busy: the load waits for it to run dry
    (`draining`), rather than the router refusing the load or stopping it mid-answer."""
    busy = dep(1, 1, "a", "loaded", in_flight=1)
    outcome = evict(dep(2, 1, "emb", model_type="embedding"), server(1, max_models=1), [busy])
    assert isinstance(outcome, NoRoom) and not outcome.permanent
    assert outcome.draining == (1,)


def test_memory_budget_evicts_until_the_model_fits():
    """Two idle models must go to make room for a big one; breaks if one eviction sufficed."""
    srv = server(1, llm=5, memory_mb=10_000)
    resident = [
        dep(1, 1, "a", "loaded", size_mb=4000, last_used_at=at(-900)),
        dep(2, 1, "b", "loaded", size_mb=4000, last_used_at=at(-600)),
        dep(3, 1, "c", "loaded", size_mb=2000, last_used_at=at(-10)),
    ]
    assert evict(dep(4, 1, "big", size_mb=6000), srv, resident) == (1, 2)


def test_only_models_that_help_are_evicted():
    """Over the LLM count but within memory: a stale embedding model stays. Breaks if the
    cheapest model went whatever its type (the first version did that with a budget)."""
    srv = server(1, llm=1, memory_mb=10_000)
    emb = dep(1, 1, "emb", "loaded", model_type="embedding", size_mb=500, last_used_at=at(-9000))
    llm = dep(2, 1, "a", "loaded", size_mb=3000)
    assert evict(dep(3, 1, "b", size_mb=3000), srv, [emb, llm]) == (2,)


def test_model_larger_than_the_budget_is_refused_for_good():
    """No eviction can help: a permanent NoRoom with a clear message and its own code."""
    outcome = evict(dep(1, 1, "huge", size_mb=50_000), server(1, memory_mb=24_000), [])
    assert isinstance(outcome, NoRoom) and outcome.permanent
    assert outcome.code == "model_too_large"
    assert "50000 MB" in outcome.reason and "24000 MB" in outcome.reason


def test_npu_runs_one_model_at_a_time():
    """Loading onto the NPU evicts the other NPU model even with type capacity to spare,
    and leaves GPU models alone."""
    srv = server(1, llm=3)
    npu = dep(1, 1, "npu-a", "loaded", device="npu")
    gpu = dep(2, 1, "gpu-a", "loaded", last_used_at=at(-9000))
    assert evict(dep(3, 1, "npu-b", device="npu"), srv, [npu, gpu]) == (1,)


def test_npu_model_busy_means_wait():
    """The other NPU model is serving: wait (not permanent); breaks if it were evicted."""
    npu = dep(1, 1, "npu-a", "loaded", device="npu", in_flight=1)
    outcome = evict(dep(3, 1, "npu-b", device="npu"), server(1, llm=3), [npu])
    assert isinstance(outcome, NoRoom) and not outcome.permanent


def test_busy_loading_and_unloading_models_are_never_evicted():
    """In-flight, loading and unloading models occupy room but cannot be chosen."""
    resident = [
        dep(1, 1, "a", "loaded", in_flight=1),
        dep(2, 1, "b", "loading"),
        dep(3, 1, "c", "unloading"),
    ]
    outcome = evict(dep(4, 1, "d"), server(1, llm=3), resident)
    assert isinstance(outcome, NoRoom) and not outcome.permanent


def test_pinned_models_are_never_evicted():
    """All room pinned: permanent, so waiting requests fail with a clear error."""
    pinned = dep(1, 1, "a", "loaded", pinned=True, last_used_at=at(-99999))
    outcome = evict(dep(2, 1, "b"), server(1), [pinned])
    assert isinstance(outcome, NoRoom) and outcome.permanent
    assert "pinned" in outcome.reason


def test_pinned_model_stays_while_an_unpinned_one_goes():
    pinned = dep(1, 1, "a", "loaded", pinned=True, last_used_at=at(-99999))
    other = dep(2, 1, "b", "loaded")
    assert evict(dep(3, 1, "c"), server(1, llm=2), [pinned, other]) == (2,)


def test_policy_veto_is_respected_and_temporary():
    """`may_evict` saying no (residency, guards) leaves the load waiting, not failed."""
    outcome = evict(dep(2, 1, "b"), server(1), [dep(1, 1, "a", "loaded")], lambda _: False)
    assert isinstance(outcome, NoRoom) and not outcome.permanent


def test_a_type_the_server_takes_none_of_is_refused_for_good():
    no_rerankers = ServerView(id=1, name="s1", capacity={"llm": 1, "reranking": 0})
    outcome = evict(dep(1, 1, "rr", model_type="reranking"), no_rerankers, [])
    assert isinstance(outcome, NoRoom) and outcome.permanent


def test_only_victims_that_are_still_needed_go():
    """Two LLMs allowed: a 42 GB and a 0.8 GB model. A 21 GB model needs a count slot (the
    small one would do) and memory (only the big one frees it); once the big one goes, the
    small one can stay. Breaks if greedy picks were evicted although unneeded (seen in the
    simulation: small models reloaded after every switch of a big one)."""
    box = server(1, llm=2, memory_mb=48_000)
    big = dep(1, 1, "big", "loaded", size_mb=42_000, avg_load_s=90.0, last_used_at=at(-60))
    small = dep(2, 1, "small", "loaded", size_mb=800, avg_load_s=3.0, last_used_at=at(-60))
    assert evict(dep(3, 1, "mid", size_mb=21_000), box, [big, small]) == (1,)

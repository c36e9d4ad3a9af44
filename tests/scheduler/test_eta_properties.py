"""The ETA forecast on any line the dashboard and the jobs API can hand it: generated
servers (some unavailable), deployments in every state with runs under way, and waiters
routed or not (some to deployments gone from the picture). It always answers, one ETA per
waiter: None (nothing can serve it) or a time from now. Pure, as test_eta.py."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.eta import Host, Place, Waiter, forecast
from scheduler.snapshot import PolicyConfig

STATES = ["loaded", "unloaded", "loading", "unloading", "failed"]


@st.composite
def lines(draw):
    hosts = [
        Host(
            hid,
            slots=draw(st.integers(1, 4)),
            capacity={"llm": draw(st.integers(1, 2)), "embedding": 1},
            available=draw(st.sampled_from([True, True, True, False])),
        )
        for hid in range(1, draw(st.integers(1, 3)) + 1)
    ]
    places, pid = [], 0
    for h in hosts:
        for model in draw(st.sets(st.sampled_from(["a", "b", "c", "e"]), min_size=1)):
            pid += 1
            state = draw(st.sampled_from(STATES))
            slots = draw(st.sampled_from([None, 1, 2]))
            busy = draw(st.lists(st.sampled_from([0.5, 3.0, 40.0]), max_size=slots or h.slots))
            places.append(
                Place(
                    pid,
                    h.id,
                    model,
                    state,
                    load_s=draw(st.sampled_from([0.1, 5.0, 90.0])),
                    run_s=draw(st.sampled_from([0.05, 2.0, 30.0])),
                    model_type="embedding" if model == "e" else "llm",
                    load_left_s=draw(st.sampled_from([0.0, 2.0])) if state == "loading" else 0.0,
                    busy_s=tuple(busy) if state == "loaded" else (),
                    idle_s=draw(st.sampled_from([0.0, 100.0])),
                    slots=slots,
                    fresh=state == "loaded" and draw(st.booleans()),
                )
            )
    ids = [p.id for p in places]
    waiters = [
        Waiter(
            i,
            draw(st.sampled_from(["a", "b", "c", "e", "z"])),
            deployment_id=draw(st.sampled_from([None, None, 99, *ids])),
            run_s=draw(st.sampled_from([None, 1.0])),
            not_before_s=draw(st.sampled_from([0.0, 0.0, 7.0])),
            effective_class=draw(st.integers(0, 3)),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    return hosts, places, waiters


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines(), st.integers(1, 3))
def test_every_waiter_gets_an_eta_or_none(line, parallel_load_queue):
    hosts, places, waiters = line
    config = PolicyConfig(parallel_load_queue=parallel_load_queue)
    etas = forecast(hosts, places, waiters, 1.0, config)
    assert set(etas) == {w.id for w in waiters}
    for w in waiters:
        eta = etas[w.id]
        assert eta is None or (math.isfinite(eta) and eta >= 0), (w, eta)
    assert etas == forecast(hosts, places, waiters, 1.0, config), "the same line, other ETAs"
    # Nothing can serve a model no available server has.
    served = {
        p.model
        for p in places
        if p.state != "failed" and any(h.available and h.id == p.server_id for h in hosts)
    }
    for w in waiters:
        if w.model not in served and w.deployment_id is None:
            assert etas[w.id] is None, w

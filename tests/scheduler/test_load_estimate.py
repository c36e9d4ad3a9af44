"""What a model's first load on a server is expected to take: what its operator says, else
the same model measured elsewhere, else its size at its server's measured speed, else at all
servers' measured speed, else the default."""

import pytest

from dashboard import forecast
from scheduler.load_estimate import expected_loads, model_name, with_expected_loads
from scheduler.policy import plan_explained
from scheduler.snapshot import DeploymentView
from scheduler.store import SnapshotReader, policy_config
from tests import factories


def dep(id, server, model, avg=None, size=None, said=None) -> DeploymentView:
    return DeploymentView(
        id=id, server_id=server, model=model, avg_load_s=avg, size_mb=size, expected_load_s=said
    )


def test_a_measured_load_is_what_is_expected_and_is_never_replaced():
    views = (dep(1, 1, "a", avg=12.0), dep(2, 2, "a", avg=30.0))
    assert with_expected_loads(views, model_name) is views


def test_what_its_operator_says_comes_first_until_a_load_is_measured():
    # `a` took 20 s elsewhere, but this server reads from a slow disk: its operator says 90.
    views = [dep(1, 1, "a", avg=20.0), dep(2, 2, "a", said=90), dep(3, 3, "a", avg=8.0, said=90)]
    assert expected_loads(views, model_name) == {1: 90.0}  # measured, the figure is moot


def test_then_the_same_model_measured_elsewhere():
    # `a` took 20 s on one server and 40 s on another: a third expects their mean, though
    # its own server's speed would say otherwise.
    views = [
        dep(1, 1, "a", avg=20.0),
        dep(2, 2, "a", avg=40.0),
        dep(3, 3, "b", avg=10.0, size=10_000),
        dep(4, 3, "a", size=1_000),
    ]
    assert expected_loads(views, model_name) == {3: 30.0}


def test_else_its_size_at_its_servers_measured_speed():
    # The server read 20 GB in 40 s and 4 GB in 8 s: 2 s a GB, so 9 GB in 18 s.
    views = [
        dep(1, 1, "big", avg=40.0, size=20_000),
        dep(2, 1, "small", avg=8.0, size=4_000),
        dep(3, 1, "new", size=9_000),
        dep(4, 1, "unsized"),  # no size: nothing to scale
    ]
    assert expected_loads(views, model_name) == {2: pytest.approx(18.0)}
    estimated = with_expected_loads(tuple(views), model_name)
    assert [d.avg_load_s for d in estimated] == [40.0, 8.0, pytest.approx(18.0), None]


def test_else_its_size_at_the_speed_measured_on_all_servers():
    # Nothing measured on server 3 yet; servers 1 and 2 read 30 GB in 50 s between them, so
    # 9 GB in 15 s there. Server 1's own speed (2 s a GB) still comes first on server 1.
    views = [
        dep(1, 1, "big", avg=40.0, size=20_000),
        dep(2, 2, "mid", avg=10.0, size=10_000),
        dep(3, 3, "new", size=9_000),
        dep(4, 1, "new", size=9_000),
        dep(5, 3, "unsized"),
    ]
    assert expected_loads(views, model_name) == {
        2: pytest.approx(15.0),
        3: pytest.approx(18.0),
    }
    # With no size known anywhere, there is no speed to go by: the default stays.
    assert expected_loads([dep(1, 1, "a", avg=5.0), dep(2, 2, "b", size=9_000)], model_name) == {}


@pytest.mark.django_db
def test_a_first_load_says_what_the_model_took_elsewhere():
    """Through the worker's snapshot: `m` loads on s2 for the first time; it took 40 s on
    s1 (now down), so its wait says ~40 s, not the flat 10 s default."""
    down = factories.server("s1", health="down")
    factories.deployment(down, "m", avg_load_s=40.0)
    factories.deployment(factories.server("s2"), "m")
    r = factories.request("m")
    planned = plan_explained(SnapshotReader().read(policy_config()), r.created_at)
    assert planned.reasons[r.pk].text == "waiting for the load of m on s2 (~40.0 s)"
    assert forecast.head(r.created_at).etas[r.pk] == 40.0  # and the ETA expects the same


@pytest.mark.django_db
def test_the_operators_figure_reaches_the_wait_reason_the_eta_and_the_load_bar():
    """Nothing measured anywhere yet: the declared 90 s, not the flat 10 s default."""
    d = factories.deployment(factories.server("s1"), "big", expected_load_s=90)
    r = factories.request("big")
    planned = plan_explained(SnapshotReader().read(policy_config()), r.created_at)
    assert planned.reasons[r.pk].text == "waiting for the load of big on s1 (~90.0 s)"
    assert forecast.head(r.created_at).etas[r.pk] == 90.0
    assert forecast.first_load_s(d) == 90.0  # what the dashboard's bar expects

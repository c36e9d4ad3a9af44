"""Fair share and the processing quota through a real web process and worker (on PostgreSQL
with Redis: separate processes; on the embedded default: one `serve`)."""

import pytest

from access.models import ApiKey, Team
from scheduler.models import Request, State
from tests import factories
from tests.access.conftest import bearer
from tests.support.polling import eventually
from tests.support.switchyard_processes import Switchyard

pytestmark = [pytest.mark.auth, pytest.mark.django_db(transaction=True)]
HI = [{"role": "user", "content": "hi"}]


def key(name: str, **fields) -> tuple[ApiKey, str]:
    api_key, secret = ApiKey.generate(name, **fields)
    api_key.save()
    return api_key, secret


@pytest.fixture
def switchyard():
    started: list[Switchyard] = []

    def start() -> Switchyard:
        started.append(Switchyard({"AUTH": "required"}))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def submit(sy: Switchyard, secret: str) -> str:
    job = {"body": {"model": "m1", "messages": HI}}
    r = sy.http.post("/api/v1/requests", json=job, headers=bearer(secret))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_one_keys_flood_does_not_hold_up_another_keys_request(switchyard, gated_upstream):
    server = factories.server("gpu", kind="openai", base_url=gated_upstream.url, slots=1)
    factories.deployment(server, "m1", state="loaded")
    flooder, flood_secret = key("flooder")
    trickler, trickle_secret = key("trickler")
    sy = switchyard()
    flood = [submit(sy, flood_secret) for _ in range(8)]
    eventually(lambda: Request.objects.filter(state=State.PROCESSING).exists())
    mine = submit(sy, trickle_secret)
    # A pass has seen it (routed it): the slot that frees next is planned.
    eventually(lambda: Request.objects.filter(pk=mine, state=State.READY).exists())
    gated_upstream.gate.set()
    eventually(lambda: not Request.objects.exclude(state=State.COMPLETED).exists(), timeout=60)
    order = [str(r) for r in Request.objects.order_by("started_at").values_list("id", flat=True)]
    # First the flood's request that held the slot, then the trickler's: not behind the
    # whole flood.
    assert order.index(mine) == 1, (order.index(mine), len(flood))


def test_a_key_at_its_quota_waits_while_another_uses_the_free_slot(switchyard, gated_upstream):
    server = factories.server("gpu", kind="openai", base_url=gated_upstream.url, slots=2)
    factories.deployment(server, "m1", state="loaded")
    _, capped_secret = key("capped", max_processing=1)
    _, other_secret = key("other")
    sy = switchyard()
    first = submit(sy, capped_secret)
    eventually(lambda: Request.objects.filter(pk=first, state=State.PROCESSING).exists())
    second = submit(sy, capped_secret)
    third = submit(sy, other_secret)
    # Sent after the capped key's second: a pass saw that one, and left it waiting.
    eventually(lambda: Request.objects.filter(pk=third, state=State.PROCESSING).exists())
    assert Request.objects.get(pk=second).state in (State.PENDING, State.READY)
    gated_upstream.gate.set()
    eventually(lambda: Request.objects.get(pk=second).state == State.COMPLETED, timeout=60)


def test_a_team_at_its_quota_waits_while_a_key_in_no_team_uses_the_free_slot(
    switchyard, gated_upstream
):
    """The team may have one request processing: its second key's request waits, with the
    team's quota as its reason, while a key in no team takes the other slot."""
    server = factories.server("gpu", kind="openai", base_url=gated_upstream.url, slots=2)
    factories.deployment(server, "m1", state="loaded")
    team = Team.objects.create(name="research", max_processing=1)
    _, first_secret = key("alice", team=team)
    _, second_secret = key("bob", team=team)
    _, other_secret = key("carol")
    sy = switchyard()
    first = submit(sy, first_secret)
    eventually(lambda: Request.objects.filter(pk=first, state=State.PROCESSING).exists())
    second = submit(sy, second_secret)
    third = submit(sy, other_secret)
    eventually(lambda: Request.objects.filter(pk=third, state=State.PROCESSING).exists())

    def told() -> dict | None:
        found = sy.http.get(f"/api/v1/requests/{second}", headers=bearer(second_secret)).json()
        return found if (found.get("reason") or {}).get("kind") == "quota" else None

    shown = eventually(told)
    assert shown["state"] in ("pending", "ready")
    assert shown["reason"]["text"] == "its team's quota is full (1 processing at once)"
    gated_upstream.gate.set()
    eventually(lambda: Request.objects.get(pk=second).state == State.COMPLETED, timeout=60)

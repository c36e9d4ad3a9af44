"""A model's own slots through a real web process and worker: a model that may run one
request at a time on a server with room for more runs one, and the server's other slots
serve its other models (on PostgreSQL with Redis: separate processes; on the embedded
default: one `serve`)."""

import pytest

from scheduler.models import Request, State
from tests import factories
from tests.support.polling import eventually
from tests.support.switchyard_processes import Switchyard

pytestmark = pytest.mark.django_db(transaction=True)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def switchyard():
    sy = Switchyard({"AUTH": "off"})
    yield sy
    sy.stop()


def submit(sy: Switchyard, model: str) -> str:
    r = sy.post("/api/v1/requests", {"body": {"model": model, "messages": HI}})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_a_model_at_its_own_slots_waits_while_another_model_uses_the_server(
    switchyard, gated_upstream
):
    server = factories.server("gpu", kind="openai", base_url=gated_upstream.url, slots=3)
    factories.deployment(server, "big", server_model_id="m1", state="loaded", slots=1)
    factories.deployment(server, "small", server_model_id="m1", state="loaded")
    first = submit(switchyard, "big")
    eventually(lambda: Request.objects.filter(pk=first, state=State.PROCESSING).exists())
    second = submit(switchyard, "big")
    third = submit(switchyard, "small")
    eventually(lambda: Request.objects.filter(pk=third, state=State.PROCESSING).exists())

    def told() -> dict | None:
        found = switchyard.http.get(f"/api/v1/requests/{second}").json()
        return found if (found.get("reason") or {}).get("kind") == "behind" else None

    shown = eventually(told)
    assert shown["state"] == "ready"
    assert shown["reason"]["text"] == "next for a slot for big on gpu (1 at once)"
    gated_upstream.gate.set()
    eventually(lambda: Request.objects.get(pk=second).state == State.COMPLETED, timeout=60)

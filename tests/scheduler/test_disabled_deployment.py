"""A deployment disabled while Switchyard runs (as the admin's action or the configuration
file does it): the worker's next pass sends its model's requests to the other server and
unloads it there once idle; enabled again, it serves again. Through a live process."""

import httpx

from backends.models import Deployment
from scheduler.models import Request
from tests import factories
from tests.support.polling import eventually

HI = [{"role": "user", "content": "hi"}]


def chat(sy) -> str:
    """The server that answered one chat."""
    answer = httpx.post(
        f"{sy.url}/v1/chat/completions",
        json={"model": "m", "messages": HI, "max_tokens": 2},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return Request.objects.get(pk=answer.headers["X-Request-Id"]).server.name


def test_a_disabled_deployment_is_left_and_its_requests_go_elsewhere(served):
    a = factories.deployment(factories.server("sim-a"), "m")
    b = factories.deployment(factories.server("sim-b"), "m", enabled=False)
    sy = served()
    assert chat(sy) == "sim-a"
    Deployment.objects.filter(pk=a.pk).update(enabled=False)
    Deployment.objects.filter(pk=b.pk).update(enabled=True)
    eventually(lambda: Deployment.objects.get(pk=a.pk).state == "unloaded")
    assert [chat(sy) for _ in range(3)] == ["sim-b"] * 3
    assert Deployment.objects.get(pk=a.pk).state == "unloaded"

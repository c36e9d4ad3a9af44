"""Keep-loaded hours, end to end on a simulated server: within them the worker loads the
model, evicting an idle one; outside them it leaves the server alone. The rule itself:
test_policy_keep_loaded.py."""

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from backends.models import Deployment, DeploymentState, LoadCause
from tests import factories
from tests.support.running import (  # noqa: F401 (fixture)
    Running,
    db_thread_closed,
    deployment_state,
    loaded_on,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
db = sync_to_async


def one_llm_server(hours: str) -> None:
    """s1 holds one LLM: `batch`, loaded and idle; `chat` has the keep-loaded `hours`."""
    s1 = factories.server("s1", slots=1)
    long_ago = timezone.now() - timedelta(hours=1)
    factories.deployment(s1, "batch", loaded_at=long_ago, last_used_at=long_ago)
    loaded_on("s1", "batch")
    factories.deployment(s1, "chat", load_s=0.05, keep_loaded_hours=hours)


async def test_within_its_hours_the_worker_loads_it_evicting_an_idle_model():
    await db(one_llm_server)("00:00-00:00")  # the whole day, every day
    async with Running() as running:
        await running.until(lambda: deployment_state("chat") == DeploymentState.LOADED)
    assert await db(deployment_state)("batch") == DeploymentState.UNLOADED
    chat = await db(Deployment.objects.get)(model__name="chat")
    assert chat.load_cause == LoadCause.PRELOAD


async def test_outside_its_hours_the_server_is_left_alone():
    later = timezone.now() + timedelta(hours=3)
    await db(one_llm_server)(f"{later:%H:%M}-{later + timedelta(hours=1):%H:%M}")
    async with Running() as running:
        await running.passes(2)
    assert await db(deployment_state)("chat") == DeploymentState.UNLOADED
    assert await db(deployment_state)("batch") == DeploymentState.LOADED

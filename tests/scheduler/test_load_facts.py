"""A load learns what its server says of the model now running, where nobody has said it
(its slots above all: a model is sent no more at once than it serves). Against the real
llama-server router: tests/integration/test_real_llama_router.py."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.base import AdapterError, ErrorCode, LoadTarget, ServerModel
from backends.models import Deployment
from scheduler import store
from scheduler.runtime import Runtime
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]


class Saying:
    """An adapter that lists one model, with what it says of it, or fails to."""

    def __init__(self, listed: ServerModel | None = None, error: AdapterError | None = None):
        self.listed, self.error = listed, error

    async def list_models(self) -> list[ServerModel]:
        if self.error is not None:
            raise self.error
        return [self.listed, ServerModel("other", "loaded", slots=9)]

    async def model_facts(self, listed: list[ServerModel]) -> dict:
        return {m.id: {"context_length": 4096} for m in listed if m.state == "loaded"}


@sync_to_async
def a_load() -> store.LoadJob:
    """The load of `m` on gpu-1, its facts unknown."""
    d = factories.deployment(factories.server("gpu-1"), "m")
    return store.LoadJob(d.pk, d.server_id, "gpu-1", "m", 1, LoadTarget("m"), (), learn_facts=True)


async def test_a_load_fills_the_slots_and_context_its_server_says(caplog):
    caplog.set_level(logging.INFO, logger="scheduler")
    job = await a_load()
    tasks = Runtime().server_tasks
    await tasks.learn_facts(Saying(ServerModel("m", "loaded", slots=2)), job)
    d = await Deployment.objects.select_related("model").aget(pk=job.deployment_id)
    assert (d.slots, d.model.context_length) == (2, 4096)  # not the other model's 9
    assert (
        "learnt from gpu-1 after the load: m (context_length: 4096); m@gpu-1 (slots)" in caplog.text
    )


async def test_a_server_that_cannot_say_leaves_them_unknown_and_the_load_stands(caplog):
    caplog.set_level(logging.INFO, logger="scheduler")
    job = await a_load()
    tasks = Runtime().server_tasks
    failing = Saying(error=AdapterError(ErrorCode.SERVER_ERROR, "the server answered 500"))
    await tasks.learn_facts(failing, job)
    assert (await Deployment.objects.aget(pk=job.deployment_id)).slots is None
    assert "m on gpu-1: could not learn its slots: the server answered 500" in caplog.text

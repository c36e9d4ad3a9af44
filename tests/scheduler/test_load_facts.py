"""A load learns what its server says of the model now running, where nobody has said it
(its slots above all: a model is sent no more at once than it serves). Against the real
llama-server router: tests/integration/test_real_llama_router.py."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.base import Adapter, AdapterError, ErrorCode, LoadTarget, ServerModel
from backends.models import Deployment
from scheduler import store
from scheduler.runtime import Runtime
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]


class Saying(Adapter):
    """An adapter that lists one model, with what it says of it, or fails to."""

    def __init__(self, listed: ServerModel | None = None, error: AdapterError | None = None):
        self.listed, self.error = listed, error

    async def list_models(self) -> list[ServerModel]:
        if self.error is not None:
            raise self.error
        return [self.listed, ServerModel("other", "loaded", slots=9)]

    async def model_facts(self, listed: list[ServerModel]) -> dict:
        return {m.id: {"context_length": 4096} for m in listed if m.state == "loaded"}


def about(job: store.LoadJob) -> tuple[int, str, str]:
    """What `learn_facts` is told of a load's deployment."""
    return job.deployment_id, job.target.server_model_id, job.server_name


@sync_to_async
def a_load() -> store.LoadJob:
    """The load of `m` on gpu-1, its facts unknown."""
    d = factories.deployment(factories.server("gpu-1"), "m")
    return store.LoadJob(d.pk, d.server_id, "gpu-1", "m", 1, LoadTarget("m"), (), learn_facts=True)


async def test_a_load_fills_the_slots_and_context_its_server_says(caplog):
    caplog.set_level(logging.INFO, logger="scheduler")
    job = await a_load()
    tasks = Runtime().server_tasks
    await tasks.learn_facts(Saying(ServerModel("m", "loaded", slots=2)), *about(job))
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
    await tasks.learn_facts(failing, *about(job))
    assert (await Deployment.objects.aget(pk=job.deployment_id)).slots is None
    assert "m on gpu-1: could not learn its slots: the server answered 500" in caplog.text


async def test_a_model_loaded_outside_switchyard_learns_them_at_the_status_sync(caplog):
    """A model its server already runs (loaded by hand, or before Switchyard) is used as it
    is found: its slots are learnt then, not at Switchyard's first load of it."""
    caplog.set_level(logging.INFO, logger="scheduler")
    d = await sync_to_async(lambda: factories.deployment(factories.server("gpu-1"), "m"))()
    runtime = Runtime()
    runtime.effects.adapters[d.server_id] = Saying(ServerModel("m", "loaded", slots=2))
    await runtime.server_tasks.sync_server(d.server_id)
    d = await Deployment.objects.select_related("model").aget(pk=d.pk)
    assert (d.state, d.slots, d.model.context_length) == ("loaded", 2, 4096)
    assert (
        "learnt from gpu-1 of a model loaded outside Switchyard: m (context_length: 4096);"
        " m@gpu-1 (slots)" in caplog.text
    )

"""No prompt and no secret in a log line, at any level, whatever happens to the request."""

import logging

import pytest
from asgiref.sync import sync_to_async

from backends.adapters.base import InferenceCall
from backends.models import DeploymentState
from scheduler import store
from scheduler.models import Request, State
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]
PROMPT = "the-caller-s-private-prompt-8d1f"
KEY = "sk-server-secret-44c2"


def test_a_job_s_repr_leaves_its_prompt_out():
    call = InferenceCall("chat", "m1", {"messages": [{"role": "user", "content": PROMPT}]})
    job = store.ServeJob("r", 1, 1, "s", 1, call)
    assert PROMPT not in repr(job) and PROMPT not in str(job)


async def test_failures_and_retries_log_neither_the_prompt_nor_the_server_s_key(caplog):
    upstream = Upstream(["m1"])
    upstream.fail_next = [(500, "upstream broke"), (400, f"bad request: {PROMPT[:5]}")]

    def setup() -> Request:
        srv = factories.server("up", kind="openai", base_url=upstream.url, api_key=KEY)
        factories.deployment(srv, "m1", state=DeploymentState.LOADED)
        payload = {"model": "m1", "messages": [{"role": "user", "content": PROMPT}]}
        request = factories.request("m1")
        Request.objects.filter(pk=request.pk).update(payload=payload)
        return request

    try:
        request = await sync_to_async(setup)()
        with caplog.at_level(logging.DEBUG):
            async with Running() as running:
                await running.until(
                    lambda: Request.objects.get(pk=request.pk).state == State.FAILED
                )
    finally:
        upstream.close()
    assert "upstream broke" in caplog.text  # the failures were logged, with their reasons
    assert PROMPT not in caplog.text
    assert KEY not in caplog.text

"""Switchyard's processes run on uvloop's event loop, and the production pair (a daphne web
process and a `run_scheduler` worker) serves calls end to end on it."""

import asyncio
import os
import socket

import httpx
import pytest
import uvloop
from django.conf import settings

from backends.models import DeploymentState
from config import event_loop
from tests import factories
from tests.conftest import database_url
from tests.support.manage_process import ManageProcess
from tests.support.openai_upstream import Upstream


def test_new_loops_are_uvloops_unless_asyncio_is_asked_for(monkeypatch):
    monkeypatch.delenv("SWITCHYARD_EVENT_LOOP", raising=False)
    loop = event_loop.new_event_loop()
    assert isinstance(loop, uvloop.Loop) and event_loop.name(loop) == "uvloop"
    assert event_loop.chosen() == "uvloop"
    loop.close()
    monkeypatch.setenv("SWITCHYARD_EVENT_LOOP", "asyncio")
    loop = event_loop.new_event_loop()
    assert isinstance(loop, asyncio.BaseEventLoop) and not isinstance(loop, uvloop.Loop)
    assert event_loop.name(loop) == "asyncio" and event_loop.chosen() == "asyncio"
    loop.close()


async def running_loop() -> str:
    return event_loop.name(asyncio.get_running_loop())


def test_run_runs_a_coroutine_to_its_result_on_the_chosen_loop(monkeypatch):
    monkeypatch.delenv("SWITCHYARD_EVENT_LOOP", raising=False)
    assert event_loop.run(running_loop()) == "uvloop"
    monkeypatch.setenv("SWITCHYARD_EVENT_LOOP", "asyncio")
    assert event_loop.run(running_loop()) == "asyncio"


@pytest.fixture
def upstream():
    up = Upstream(["m1"])
    yield up
    up.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    not (settings.IS_POSTGRES and settings.REDIS_URL),
    reason="a web process and a worker apart talk through PostgreSQL and Redis",
)
def test_the_web_process_and_the_worker_serve_on_uvloop(upstream):
    srv = factories.server("up", kind="openai", base_url=upstream.url)
    factories.deployment(srv, "m1", state=DeploymentState.LOADED)
    env = {**os.environ, "DATABASE_URL": database_url(), "SWITCHYARD_DRAIN_S": "0"}
    # The test binds the web's socket: calls queue in its backlog until daphne accepts them.
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    web = ManageProcess(
        ["--fd", str(listening.fileno()), "config.asgi:application"],
        env,
        lambda line: "event loop" in line,
        program=("-m", "config.web"),
        pass_fds=(listening.fileno(),),
    )
    worker = ManageProcess(["run_scheduler"], env, lambda line: " started" in line)
    try:
        assert "web process on uvloop's event loop" in web.log[-1]
        assert "started on uvloop's event loop" in worker.log[-1]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(url, json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "Hello from upstream"
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 2
    finally:
        listening.close()
        for process in (web, worker):
            process.proc.terminate()
            process.output(timeout=30)

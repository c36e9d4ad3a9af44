"""The real llama.cpp router shared with a client that calls it directly, not through
Switchyard: what Switchyard decides on its own (an idle TTL) does not cut that client off."""

import threading

import httpx
import pytest

from backends.adapters.llamacpp import LlamaCppAdapter
from backends.models import Deployment, DeploymentState
from tests.integration.conftest import WAIT_S, eventually
from tests.integration.test_real_llama_router import discovered, events, states

pytestmark = pytest.mark.integration


def test_an_idle_ttl_keeps_a_model_someone_else_is_running(router, switchyard):
    """Someone streams 4,000 tokens from `large` straight from the router; its deployment
    has an idle TTL of 1 s. Switchyard sees `large` loaded outside it, and when the TTL runs
    out asks the router's `/slots` first, finds it processing and keeps it: the stream ends
    whole. Once it has ended, the TTL unloads it. Breaks if the TTL's unload cut the stream
    (its last events the router's bare `proxy error`, no finish)."""
    server = discovered(router)
    Deployment.objects.filter(server=server, model__name="large").update(idle_ttl_s=1)
    live = switchyard(STATUS_SYNC_S="0.5")
    lines: list[str] = []
    begun, ended = threading.Event(), threading.Event()

    def read() -> None:  # read as it comes: a stream not read holds the router up
        body = {"model": "large", "prompt": "Once", "max_tokens": 4000, "stream": True}
        url = f"{router.url}/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            for line in response.iter_lines():
                lines.append(line)
                if line.startswith("data: "):
                    begun.set()
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    assert begun.wait(WAIT_S), lines
    worker = live.processes[-1]  # the worker (`serve` runs it on the embedded default)
    guard = threading.Timer(WAIT_S, worker.proc.terminate)  # no line: it fails, not hangs
    guard.start()
    try:
        worker.wait_for_line("kept large loaded (idle for 1 s): its server runs 1 request(s)")
    finally:
        guard.cancel()
    assert not ended.is_set(), "the stream ended before the TTL ran out: make it longer"
    assert ended.wait(120)
    streamed = events(lines)
    assert streamed[-1] == "[DONE]", streamed[-3:]
    assert all("choices" in chunk for chunk in streamed[:-1]), streamed[-3:]
    assert streamed[-2]["choices"][0]["finish_reason"] == "length"
    eventually(lambda: states(server)["large"] == DeploymentState.UNLOADED, what="unloaded")


async def test_what_a_single_model_server_says_it_runs(single):
    """`/slots` without a model on a single-model server; None with `--no-slots` (it cannot
    say, so an idle TTL unloads as it would anyway)."""
    with_slots, without = single("tiny-5mb"), single("tiny-5mb", "--no-slots")
    for server, said in ((with_slots, 0), (without, None)):
        adapter = LlamaCppAdapter(server.url)
        try:
            await adapter.list_models()  # learns it is no router
            assert await adapter.running("tiny-5mb") == said
        finally:
            await adapter.close()

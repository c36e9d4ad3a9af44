"""The real llama.cpp router shared with a client that calls it directly, not through
Switchyard: neither what Switchyard decides on its own (an idle TTL) nor an eviction for its
own requests cuts that client off."""

import threading
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from backends.adapters.llamacpp import LlamaCppAdapter
from backends.models import Deployment, DeploymentState
from scheduler.models import Request
from tests.integration.conftest import WAIT_S, eventually
from tests.integration.test_real_llama_router import (
    CHAT,
    chat,
    discovered,
    events,
    router_states,
    states,
)

pytestmark = pytest.mark.integration


class Outside:
    """Someone streaming 1,500 tokens of `model` straight from the router, read as they come
    (a stream not read holds the router up); begun once the first token came."""

    def __init__(self, router, model: str) -> None:
        self.lines: list[str] = []
        self.ended = threading.Event()
        self.begun = threading.Event()
        body = {"model": model, "prompt": "Once", "max_tokens": 1500, "stream": True}
        threading.Thread(target=self.read, args=(router.url, body), daemon=True).start()
        assert self.begun.wait(WAIT_S), self.lines

    def read(self, url: str, body: dict) -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                self.lines.append(line)
                if line.startswith("data: "):
                    self.begun.set()
        self.ended.set()

    def ends_whole(self) -> None:
        """It ends with its 1,500 tokens, not cut off (its last events the router's bare
        `proxy error`, no finish)."""
        assert self.ended.wait(120)
        streamed = events(self.lines)
        assert streamed[-1] == "[DONE]", streamed[-3:]
        assert all("choices" in chunk for chunk in streamed[:-1]), streamed[-3:]
        assert streamed[-2]["choices"][0]["finish_reason"] == "length"
        assert streamed[-2]["timings"]["predicted_n"] == 1500  # llama-server's own count


def worker_says(live, text: str) -> None:
    worker = live.processes[-1]  # the worker (`serve` runs it on the embedded default)
    guard = threading.Timer(WAIT_S, worker.proc.terminate)  # no line: it fails, not hangs
    guard.start()
    try:
        worker.wait_for_line(text)
    finally:
        guard.cancel()


def test_an_idle_ttl_keeps_a_model_someone_else_is_running(router, switchyard):
    """Someone streams 1,500 tokens from `large` straight from the router; its deployment
    has an idle TTL of 1 s. Switchyard's first status sync sees `large` loaded outside it
    (and busy), and no other sync comes before the TTL runs out (a status sync that sees it
    busy counts it as used, and the TTL starts again): then the worker asks the router's
    `/slots` first, finds it processing and keeps it, and the stream ends whole. Once it has
    ended, the TTL unloads it. Breaks if the TTL's unload cut the stream."""
    server = discovered(router)
    Deployment.objects.filter(server=server, model__name="large").update(idle_ttl_s=1)
    outside = Outside(router, "large")
    live = switchyard(STATUS_SYNC_S="60")
    worker_says(live, "kept large loaded (idle for 1 s): its server runs 1 request(s)")
    assert not outside.ended.is_set(), "the stream ended before the TTL ran out: make it longer"
    outside.ends_whole()
    eventually(lambda: states(server)["large"] == DeploymentState.UNLOADED, what="unloaded")


def test_an_eviction_lets_someone_elses_stream_finish_first(router, switchyard):
    """Someone streams from `large` straight from the router, which holds one model; a
    request for `tiny` comes to Switchyard. Before unloading `large` for it, Switchyard asks
    the router's `/slots`, finds it processing, and waits for the stream to end: it ends
    whole, and then `tiny` loads and answers. Without, the eviction cut the stream off."""
    server = discovered(router, max_llm=1)
    # A grace the stream never outlasts, even on a machine busy enough to slow it tenfold.
    live = switchyard(STATUS_SYNC_S="0.5", MIN_RESIDENCY_S="0", OUTSIDE_GRACE_S="300")
    outside = Outside(router, "large")
    eventually(lambda: states(server)["large"] == DeploymentState.LOADED, what="seen loaded")
    answer = chat(live, "tiny")
    assert outside.ended.is_set(), "tiny answered before the stream ended"
    outside.ends_whole()
    assert answer["choices"][0]["message"]["content"]
    worker_says(live, "router first lets 1 request(s) on large that Switchyard did not send")


def test_a_load_called_off_leaves_someone_elses_stream_alone(router, switchyard):
    """As above, but the job for `tiny` is cancelled while its load waits for the stream:
    the load is called off, the stream ends whole and `large` stays loaded, on the router
    and in Switchyard. Without, `large` was unloaded under the stream once the grace ran out
    (or the stream ended), for a model nobody wanted any more."""
    server = discovered(router, max_llm=1)
    live = switchyard(STATUS_SYNC_S="0.5", MIN_RESIDENCY_S="0", OUTSIDE_GRACE_S="300")
    outside = Outside(router, "large")
    eventually(lambda: states(server)["large"] == DeploymentState.LOADED, what="seen loaded")
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 8}
    job = live.post("/api/v1/requests", {"kind": "chat", "body": body}).json()
    worker_says(live, "router first lets 1 request(s) on large that Switchyard did not send")
    assert live.http.delete(f"/api/v1/requests/{job['id']}").status_code == 200
    worker_says(live, "called off the load of tiny on router: nobody waits for it any more")
    outside.ends_whole()
    assert (states(server)["large"], states(server)["tiny"]) == ("loaded", "unloaded")
    assert router_states(router)["large"] == "loaded"


def test_a_model_others_use_counts_as_used(router, switchyard):
    """Someone asks `tiny` for a few tokens straight from the router, again and again;
    Switchyard sends it nothing. Its status sync reads the router's `/slots` for `tiny` (it
    has an idle TTL), sees its last task id move, and counts it as used (its idle TTL
    starts again). Without, its last use stayed an hour back, and an idle TTL unloaded it
    under that client."""
    server = discovered(router)
    Deployment.objects.filter(server=server, model__name="tiny").update(idle_ttl_s=86_400)
    switchyard(STATUS_SYNC_S="0.5")
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 2}

    def direct() -> None:
        httpx.post(f"{router.url}/v1/completions", json=body, timeout=60).raise_for_status()

    direct()  # the router loads it
    eventually(lambda: states(server)["tiny"] == DeploymentState.LOADED, what="seen loaded")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    tiny = server.deployments.get(server_model_id="tiny")
    Deployment.objects.filter(pk=tiny.pk).update(last_used_at=an_hour_ago)

    def seen_used() -> bool:
        direct()
        tiny.refresh_from_db()
        return tiny.last_used_at > an_hour_ago

    eventually(seen_used, what="tiny seen used by the router's other client")
    assert not Request.objects.exists()


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

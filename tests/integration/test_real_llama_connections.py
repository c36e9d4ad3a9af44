"""Calls one after another on the real `llama-server` (b11434), each on its first try.

llama-server closes the connection after a streamed answer, and its router after every
answer it relays from a model's process, without saying so (`Connection: close`) when the
client asked for keep-alive, as httpx does. A call sent on that pooled connection failed at
once ("Can not write request body", "Server disconnected"): every other call, when they came
one at a time. The `llamacpp` and `openai` kinds ask for a connection per inference call.
"""

import pytest

from backends.adapters.base import InferenceCall
from backends.adapters.llamacpp import LlamaCppAdapter
from backends.adapters.openai import OpenAIAdapter
from tests.integration.conftest import eventually
from tests.support import real_llama

pytestmark = pytest.mark.integration

STREAMED = [False, True, False, False, True, True]  # every change of kind, and repeats


@pytest.fixture(params=["single", "router"])
def llama_server(request, llama_server_binary, tiny_models, tmp_path):
    """(url, model): a single-model server, or the router with that model loaded."""
    if request.param == "single":
        argv = ["-m", tiny_models["tiny-5mb"], "--alias", "tiny", "-c", "512"]
    else:
        preset = tmp_path / "models.ini"
        preset.write_text(real_llama.preset({"tiny": {"model": tiny_models["tiny-5mb"]}}))
        argv = ["--models-preset", str(preset), "--models-max", "1"]
    server = real_llama.RealLlamaServer(argv, tmp_path)
    if request.param == "router":
        server.api("POST", "/models/load", json={"model": "tiny"})
        eventually(lambda: server.status("tiny")["value"] == "loaded", what="tiny loaded")
    yield server.url, "tiny"
    server.stop()


@pytest.mark.parametrize("kind", [LlamaCppAdapter, OpenAIAdapter])
async def test_calls_one_after_another_each_on_the_first_try(llama_server, kind):
    url, model = llama_server
    adapter = kind(url)
    try:
        await adapter.list_models()  # the llamacpp kind learns the server's mode
        for stream in STREAMED:
            call = InferenceCall(
                "chat",
                model,
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                stream=stream,
            )
            if stream:
                chunks = [chunk async for chunk in adapter.stream(call)]
                # The finish, then the usage it is always asked for (`counting_usage`).
                assert [c["choices"][0]["finish_reason"] for c in chunks[-2:-1]] == ["length"]
                assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"]
            else:
                answer = await adapter.run(call)
                assert answer["choices"][0]["finish_reason"] == "length"
    finally:
        await adapter.close()

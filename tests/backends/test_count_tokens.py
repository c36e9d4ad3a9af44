"""Anthropic's count of a message's tokens (`/v1/messages/count_tokens`) against replays:
sent on by the kinds whose server has the route (llama-server, and an OpenAI-compatible
server, which may be one), refused without asking by the kinds whose references list none.
The real llama-server's answer is in tests/integration/test_real_llama_single.py."""

from collections.abc import Callable
from functools import partial

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall
from backends.adapters.http import HttpAdapter
from backends.adapters.registry import adapter_class
from tests.support.replay_server import Reply

BODY = {"model": "x", "messages": [{"role": "user", "content": "hi there"}]}
PATH = "/v1/messages/count_tokens"


@pytest.fixture(params=["llamacpp", "openai"])
def make_adapter(request) -> Callable[[str], HttpAdapter]:
    return partial(adapter_class(request.param), api_key="sk-local")


async def test_sent_to_the_servers_own_route(server, adapter):
    server.on("GET", "/v1/models", Reply(200, {"object": "list", "data": [{"id": "m"}]}))
    server.on("POST", PATH, Reply(200, {"input_tokens": 12}))
    assert await adapter.run(InferenceCall("count_tokens", "m", BODY)) == {"input_tokens": 12}
    sent = server.requests_to("POST", PATH)[0]
    assert sent.body["model"] == "m" and sent.body["messages"] == BODY["messages"]


@pytest.mark.parametrize("kind", ["ollama", "lmstudio", "llamaswap", "vllm", "lemonade"])
async def test_refused_without_asking_where_the_server_has_no_such_route(server, kind):
    adapter = adapter_class(kind)(server.url)
    try:
        with pytest.raises(AdapterError) as raised:
            await adapter.run(InferenceCall("count_tokens", "m", BODY))
    finally:
        await adapter.close()
    assert raised.value.code == ErrorCode.BAD_REQUEST
    assert "count_tokens" in raised.value.message
    assert not [c for c in server.calls() if c[0] == "POST"]

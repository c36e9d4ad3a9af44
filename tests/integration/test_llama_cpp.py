"""Switchyard end to end in front of a real inference server: llama-cpp-python's
OpenAI-compatible server with two tiny generated models, which it swaps on demand."""

import openai
import pytest

from backends.models import Deployment, Model, ModelType, Server
from scheduler.models import Request, State
from tests.support import tiny_gguf

pytestmark = pytest.mark.integration

CHAT = [{"role": "user", "content": "Say something."}]
# The tiny models only ever generate whole words from their vocabulary (see tiny_gguf).
WORDS = {piece.removeprefix("\u2581") for piece in tiny_gguf.word_pieces(tiny_gguf.SMALL.words)}


@pytest.fixture
def switchyard(served, llama):
    server = Server.objects.create(
        name="llama", kind="openai", base_url=llama.url, slots=1, health="up"
    )
    small, large, embed = llama.aliases
    for name, server_model_id, kind in [
        ("small", small, ModelType.LLM),
        ("large", large, ModelType.LLM),
        ("embed", embed, ModelType.EMBEDDING),
    ]:
        model = Model.objects.create(name=name, type=kind)
        Deployment.objects.create(
            server=server, model=model, server_model_id=server_model_id, device="cpu"
        )
    live = served()
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)


def chat(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8)
    assert answer.choices[0].finish_reason == "length"
    return answer.choices[0].message.content


def streamed_chat(client: openai.OpenAI, model: str) -> str:
    chunks = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_both_models_alternately_streamed_and_not(switchyard, llama):
    # Each request names the other model, so llama_cpp.server swaps models every time.
    answers = [
        chat(switchyard, "small"),
        streamed_chat(switchyard, "large"),
        streamed_chat(switchyard, "small"),
        chat(switchyard, "large"),
        switchyard.completions.create(model="small", prompt="Once", max_tokens=8).choices[0].text,
    ]
    for answer in answers:
        assert answer.split() and set(answer.split()) <= WORDS, (answers, llama.log())

    vector = switchyard.embeddings.create(model="embed", input="hello").data[0].embedding
    assert len(vector) == tiny_gguf.SMALL.dim  # mean-pooled over the input's tokens

    requests = list(Request.objects.order_by("created_at"))
    assert [r.model_name for r in requests] == ["small", "large"] * 2 + ["small", "embed"]
    for r in requests:
        assert r.state == State.COMPLETED, (r.model_name, r.error)
        assert r.traces.order_by("at", "id").last().to_state == State.COMPLETED
        assert r.result

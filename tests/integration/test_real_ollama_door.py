"""Ollama's own API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/tags`) through
Switchyard's real processes, called by the official `ollama` client, in front of the real
llama.cpp router (b11434): an app written for Ollama shares the router's models."""

import pytest
from django.core.management import call_command

from backends.models import Server
from scheduler.models import Request, State

pytest.importorskip("gguf", reason="needs the integration extra: pip install -e '.[integration]'")
ollama = pytest.importorskip("ollama", reason="needs the test extra: pip install -e '.[test]'")
from tests.support import tiny_gguf  # noqa: E402 (needs gguf)

pytestmark = pytest.mark.integration

HI = [{"role": "user", "content": "Say something."}]
WORDS = {piece.removeprefix("\u2581") for piece in tiny_gguf.word_pieces(tiny_gguf.SMALL.words)}


def assert_words(text: str) -> None:
    assert text.split() and set(text.split()) <= WORDS, text


def test_an_app_written_for_ollama_chats_generates_and_embeds(router, switchyard):
    Server.objects.create(
        name="router", kind="llamacpp", base_url=router.url, slots=2, health="up", max_llm=1
    )
    call_command("sync_models", "router")
    live = switchyard()
    client = ollama.Client(host=live.url, timeout=300)

    assert {"tiny", "large", "embed"} <= {m.model for m in client.list().models}
    assert client.show("tiny").capabilities == ["completion"]
    answer = client.chat(model="tiny", messages=HI, options={"num_predict": 8}, think=False)
    assert_words(answer.message.content)
    assert (answer.done, answer.eval_count) == (True, 8)

    # The swap to `large` is the scheduler's; the client reads lines as they come.
    parts = list(client.chat(model="large", messages=HI, options={"num_predict": 8}, stream=True))
    assert parts[-1].done and parts[-1].done_reason == "length"
    assert_words("".join(p.message.content for p in parts))

    generated = client.generate(model="tiny", prompt="Once", options={"num_predict": 4})
    assert_words(generated.response)
    raw = client.generate(model="tiny", prompt="Once", raw=True, options={"num_predict": 4})
    assert_words(raw.response)

    vectors = client.embed(model="embed", input=["hello", "world"]).embeddings
    assert [len(v) for v in vectors] == [tiny_gguf.SMALL.dim] * 2
    assert "embed" in {m.model for m in client.ps().models}  # as the worker saw it loaded
    assert set(Request.objects.values_list("state", flat=True)) == {State.COMPLETED}

"""Ollama's own API through a live Switchyard (`manage.py serve`), with the official `ollama`
client: what it sends is translated into OpenAI requests for the servers, and what they
answer is translated back."""

import json

import httpx
import ollama
import openai
import pytest

from access.models import ApiKey
from backends.models import Deployment, Model
from scheduler.models import Request, State
from tests import factories
from tests.support.openai_upstream import Upstream


@pytest.fixture
def upstream():
    up = Upstream(["qwen-upstream", "embed-upstream"])
    yield up
    up.close()


@pytest.fixture
def live(served, transactional_db, upstream):
    srv = factories.server("up", kind="openai", base_url=upstream.url, slots=4)
    factories.model("qwen", aliases=["qwen3:8b"])
    factories.model("nomic", type="embedding")
    factories.deployment(srv, "qwen", server_model_id="qwen-upstream", state="loaded")
    factories.deployment(srv, "nomic", server_model_id="embed-upstream", state="loaded")
    return served()


def client(live, **headers: str) -> ollama.Client:
    return ollama.Client(host=live.url, headers=headers or None)


def openai_client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")


def sent(upstream: Upstream) -> dict:
    return upstream.received[-1]


def test_a_chat_is_answered_in_ollamas_shape(live, upstream):
    answer = client(live).chat(
        model="qwen",
        messages=[{"role": "user", "content": "hi"}],
        stream=False,
        options={"temperature": 0.2, "num_predict": 64, "top_k": 5},
        format="json",
        keep_alive="5m",
    )
    assert answer.message.role == "assistant"
    assert answer.message.content == "Hello from upstream"
    assert (answer.done, answer.done_reason) == (True, "stop")
    assert (answer.prompt_eval_count, answer.eval_count) == (1, 3)
    assert answer.model == "qwen"
    body = sent(upstream)["body"]
    assert sent(upstream)["path"] == "/v1/chat/completions"
    assert body["model"] == "qwen-upstream"
    assert (body["temperature"], body["max_tokens"], body["top_k"]) == (0.2, 64, 5)
    assert body["response_format"] == {"type": "json_object"}
    assert "keep_alive" not in body  # Switchyard keeps models loaded by its own rules
    assert Request.objects.get().state == State.COMPLETED


def test_a_streamed_chat_is_lines_ending_with_one_done(live, upstream):
    hi = [{"role": "user", "content": "hi"}]
    parts = list(client(live).chat(model="qwen3:8b", messages=hi, stream=True))
    text = "".join(p.message.content for p in parts)
    assert text == "Hello from upstream"
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert parts[-1].done_reason == "stop"
    assert sent(upstream)["body"]["stream"] is True


def test_a_call_that_does_not_say_is_streamed_as_lines_and_one_comes_at_once(live):
    """Ollama streams unless told not to. Every line is a JSON object (the client reads
    them so); the first goes at once, with no text, so that the answer's headers and
    something to read come before the model's first token, however long a load takes."""
    with httpx.stream(
        "POST",
        f"{live.url}/api/chat",
        json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    ) as answer:
        assert answer.headers["content-type"] == "application/x-ndjson"
        assert answer.headers["X-Request-Id"]
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    assert lines[0]["message"] == {"role": "assistant", "content": ""}
    assert lines[0]["done"] is False
    assert lines[-1]["done"] is True


def test_a_generate_is_a_chat_with_its_prompt_and_a_raw_one_a_completion(live, upstream):
    answer = client(live).generate(model="qwen", prompt="hi", system="be brief", stream=False)
    assert (answer.response, answer.done) == ("Hello from upstream", True)
    assert sent(upstream)["body"]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    raw = client(live).generate(model="qwen", prompt="[INST] hi [/INST]", raw=True, stream=False)
    assert raw.response == "Hello from upstream"
    assert sent(upstream)["path"] == "/v1/completions"
    assert sent(upstream)["body"]["prompt"] == "[INST] hi [/INST]"
    streamed = client(live).generate(model="qwen", prompt="hi", stream=True)
    assert "".join(p.response for p in streamed) == "Hello from upstream"


def test_images_go_as_data_urls_beside_the_text(live, upstream):
    client(live).chat(
        model="qwen",
        messages=[{"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}],
        stream=False,
    )
    content = sent(upstream)["body"]["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]


def test_embed_answers_every_input_in_order(live, upstream):
    answer = client(live).embed(model="nomic", input="hello")
    assert answer.embeddings == [[0.1, 0.2]]
    assert sent(upstream)["path"] == "/v1/embeddings"
    assert sent(upstream)["body"] == {"model": "embed-upstream", "input": "hello"}


def test_tags_ps_show_and_version_say_what_may_be_asked(live):
    names = [m.model for m in client(live).list().models]
    assert names == ["nomic", "qwen", "qwen3:8b"]
    assert [m.model for m in client(live).ps().models] == ["nomic", "qwen"]  # loaded now
    assert client(live).show("qwen3:8b").capabilities == ["completion"]
    assert client(live).show("nomic").capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as unknown:
        client(live).show("nope")
    assert unknown.value.status_code == 404
    assert httpx.get(f"{live.url}/api/version").json() == {"version": "0.12.0"}


def test_what_a_model_takes_and_its_context_are_shown_where_clients_look(live):
    """Tools clients (editors' Ollama providers among them) offer a model for agents only
    when `capabilities` has `tools`, and size its prompts by `<architecture>.context_length`."""
    Model.objects.filter(name="qwen").update(capabilities=["tools", "vision"], context_length=32768)

    shown = client(live).show("qwen3:8b")
    assert shown.capabilities == ["completion", "tools", "vision"]
    architecture = shown.modelinfo["general.architecture"]
    assert shown.modelinfo[f"{architecture}.context_length"] == 32768
    Deployment.objects.filter(model__name="qwen").update(size_mb=5000)
    tags = httpx.get(f"{live.url}/api/tags").json()["models"]
    assert {m["name"]: (m["capabilities"], m["size"] // 2**20) for m in tags} == {
        "nomic": (["embedding"], 0),  # no size known
        "qwen": (["completion", "tools", "vision"], 5000),
        "qwen3:8b": (["completion", "tools", "vision"], 5000),
    }
    running = httpx.get(f"{live.url}/api/ps").json()["models"]
    assert [m.get("context_length") for m in running] == [None, 32768]  # nomic, qwen
    # Unknown: only what the model's type does, and no model_info.
    assert client(live).show("nomic").modelinfo == {}
    # OpenAI's listing shows them too, where known.
    listed = {m.id: m for m in openai_client(live).models.list().data}
    assert (listed["qwen"].capabilities, listed["qwen"].context_length) == (
        ["tools", "vision"],
        32768,
    )
    assert not hasattr(listed["nomic"], "capabilities")
    # Images for a model known to take none are refused at once, in Ollama's shape.
    Model.objects.filter(name="qwen").update(capabilities=["tools"])
    with pytest.raises(ollama.ResponseError) as refused:
        client(live).chat(
            model="qwen",
            messages=[{"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}],
            stream=False,
        )
    assert refused.value.status_code == 400
    assert "does not take images" in refused.value.error
    assert not Request.objects.exists()


def test_errors_are_ollamas_and_bad_input_stores_nothing(live):
    with pytest.raises(ollama.ResponseError) as unknown:
        client(live).chat(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.status_code == 404
    assert "nope" in unknown.value.error
    hi = [{"role": "user", "content": "hi"}]
    refused = httpx.post(
        f"{live.url}/api/chat", json={"model": "qwen", "messages": hi, "format": 3}, timeout=10
    )
    assert refused.status_code == 400
    assert refused.json() == {"error": 'format must be "json" or a JSON schema'}
    broken = httpx.post(f"{live.url}/api/chat", content=b"{", timeout=10)
    assert broken.status_code == 400 and set(broken.json()) == {"error"}
    assert not Request.objects.exists()


def test_a_call_that_only_loads_is_answered_at_once_and_stores_nothing(live, upstream):
    """Ollama's CLI loads a model (a chat without messages) before `ollama run`; Ollama
    answers `done_reason: load` (`unload` for `ollama stop`'s `keep_alive: 0`). Switchyard
    answers at once: it loads a model when a request for it needs it. A model the caller
    may not use is refused as on any call."""
    loaded = client(live).chat(model="qwen3:8b")  # by an alias
    assert (loaded.done, loaded.done_reason, loaded.message.content) == (True, "load", "")
    [streamed] = list(client(live).chat(model="qwen", stream=True))
    assert streamed.done_reason == "load"
    generated = client(live).generate(model="qwen", stream=False)
    assert (generated.done_reason, generated.response) == ("load", "")
    # `ollama stop`: a generate without a prompt that keeps the model 0 s, answered as
    # Ollama answers it; the model leaves by Switchyard's rules (others may be using it).
    stopped = client(live).generate(model="qwen", stream=False, keep_alive=0)
    assert (stopped.done, stopped.done_reason) == (True, "unload")
    assert client(live).chat(model="qwen", keep_alive="0s").done_reason == "unload"
    assert client(live).chat(model="qwen", keep_alive="5m").done_reason == "load"
    with pytest.raises(ollama.ResponseError) as unknown:
        client(live).chat(model="nope")
    assert unknown.value.status_code == 404
    assert not Request.objects.exists() and upstream.received == []


@pytest.mark.auth
def test_keys_are_asked_for_as_on_every_path(served, transactional_db, upstream):
    srv = factories.server("up", kind="openai", base_url=upstream.url)
    factories.deployment(srv, "qwen", server_model_id="qwen-upstream", state="loaded")
    key, secret = ApiKey.generate("app")
    key.save()
    live = served(SWITCHYARD_AUTH="required")
    with pytest.raises(ollama.ResponseError) as refused:
        client(live).chat(model="qwen", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 401
    with pytest.raises(ollama.ResponseError):
        client(live).list()
    with pytest.raises(ollama.ResponseError):
        client(live).ps()
    keyed = client(live, Authorization=f"Bearer {secret}")
    assert keyed.chat(model="qwen", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert [m.model for m in keyed.list().models] == ["qwen"]
    assert [m.model for m in keyed.ps().models] == ["qwen"]

"""A streamed chat that asks (`X-Switchyard-Progress: reasoning`, or the operator's
`SWITCHYARD_STREAM_PROGRESS`) sees its wait as `reasoning_content` chunks, which chat apps
show as the model's thinking, through a live Switchyard (`manage.py serve`)."""

import json
import re

import httpx
import pytest

from access.models import ApiKey
from scheduler.models import Request
from tests import factories

CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
LOAD_S = 1.5  # several waiting ticks (`served` ticks every 0.5 s)


def stream(
    live, path: str, model: str, progress: str | None = None, secret: str | None = None
) -> list[dict]:
    """The `data:` events of a streamed call, [DONE] excluded."""
    headers = {} if progress is None else {"X-Switchyard-Progress": progress}
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    body = {"model": model, **CHAT}
    if path == "/v1/completions":
        body = {"model": model, "prompt": "hi", "stream": True}
    with httpx.stream(
        "POST", f"{live.url}{path}", json=body, headers=headers, timeout=30
    ) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def thinking(events: list[dict]) -> list[str]:
    return [
        e["choices"][0]["delta"]["reasoning_content"]
        for e in events
        if "reasoning_content" in e["choices"][0].get("delta", {})
    ]


def key(name: str, **fields) -> str:
    """A new API key's secret."""
    api_key, secret = ApiKey.generate(name, **fields)
    api_key.save()
    return secret


def cold_models(*names: str) -> None:
    """Each model on a simulated server of its own, unloaded: every first call waits."""
    for name in names:
        factories.deployment(factories.server(f"sim-{name}"), name, load_s=LOAD_S)


def test_a_chat_that_asks_sees_its_wait_then_the_answer(served):
    cold_models("m1")
    live = served()
    events = stream(live, "/v1/chat/completions", "m1", "reasoning")
    lines = thinking(events)
    assert lines, "no progress while the model loaded"
    assert re.match(  # with its ETA once the worker's history task has forecast one
        r"Switchyard: waiting, position 1 in line(, sent (in ~\d+ s|any moment))?:"
        " waiting for the load of m1 on sim-m1",
        lines[0],
    )
    assert all(line.endswith(".\n") for line in lines)
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False))  # a line per change
    # The progress comes first, as chunks of the request's own id and model; then the answer.
    first = events[0]
    request = Request.objects.get()
    assert first["id"] == f"chatcmpl-{request.pk.hex}" and first["model"] == "m1"
    assert first["object"] == "chat.completion.chunk"
    answer = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert answer and events.index(answer[0]) == len(lines)


def test_the_operator_default_and_what_a_caller_asks(served):
    cold_models("m1", "m2", "m3", "m4")
    live = served(SWITCHYARD_STREAM_PROGRESS="reasoning")
    assert thinking(stream(live, "/v1/chat/completions", "m1"))  # the operator's default
    assert not thinking(stream(live, "/v1/chat/completions", "m2", "comments"))
    # A completion has no place for thinking: only the chat shows it.
    assert not thinking(stream(live, "/v1/completions", "m3", "reasoning"))
    plain = served()  # the default: SSE comments only, which apps do not show
    assert not thinking(stream(plain, "/v1/chat/completions", "m4"))


@pytest.mark.auth
def test_a_key_can_ask_for_it_for_every_stream_it_sends(served):
    """For a chat app that sends no headers of its own: the operator sets it on the app's
    key. A caller's header still wins, and another key gets the server's default."""
    cold_models("m1", "m2", "m3")
    app = key("open-webui", stream_progress="reasoning")
    other = key("script")
    live = served(SWITCHYARD_AUTH="required")
    assert thinking(stream(live, "/v1/chat/completions", "m1", secret=app))
    assert not thinking(stream(live, "/v1/chat/completions", "m2", "comments", secret=app))
    assert not thinking(stream(live, "/v1/chat/completions", "m3", secret=other))


def test_an_unknown_progress_is_400_and_stores_nothing(served):
    cold_models("m1")
    live = served()
    refused = httpx.post(
        f"{live.url}/v1/chat/completions",
        json={"model": "m1", **CHAT},
        headers={"X-Switchyard-Progress": "thinking"},
        timeout=30,
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_value" and error["param"] == "X-Switchyard-Progress"
    assert "comments, reasoning" in error["message"]
    assert not Request.objects.exists()

"""`POST /v1/messages`, Anthropic's Messages API, for apps built on Anthropic's client
(Claude Code and others pointed at local models): answered and streamed through the
scheduler and read with the `anthropic` client, its key sent as `x-api-key`; a stream's
events are named (Anthropic's client reads no others) and folded into the stored message;
a caller that missed the end gets it; bad input is a 400 that stores nothing. The real
llama-server's side is in tests/integration/test_real_llama_single.py."""

from datetime import UTC, datetime, timedelta

import anthropic
import httpx
import pytest

from access import usage
from access.models import ApiKey
from backends import messages_api
from backends.models import Model, ModelType
from scheduler.models import Request, State
from scheduler.streams import CatchUp, answer_text, text_of
from tests import factories
from tests.support.openai_upstream import Upstream

START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "stop_reason": None,
        "usage": {"input_tokens": 9, "output_tokens": 0},
    },
}
EVENTS = [
    START,
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " you"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "t1", "name": "look", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '"Oslo"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    },
    {"type": "message_stop"},
]


@pytest.fixture
def live(served, make_key):
    factories.deployment(factories.server("sim"), "m")
    return served(SWITCHYARD_AUTH="required")


@pytest.fixture
def make_key(transactional_db):
    def make(name: str = "app") -> str:
        api_key, secret = ApiKey.generate(name)
        api_key.save()
        return secret

    return make


def client(live, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key=key, max_retries=0)


def test_a_message_answered_and_streamed_with_anthropics_client(live, make_key):
    key = make_key()
    c = client(live, key)
    hi = [{"role": "user", "content": "hi"}]
    answer = c.messages.create(model="m", max_tokens=4, system="Be brief.", messages=hi)
    assert answer.type == "message" and len(answer.content[0].text.split()) == 4
    # The simulated model runs to the cap it is given, and says so as Anthropic's does.
    assert answer.usage.output_tokens == 4 and answer.stop_reason == "max_tokens"

    with c.messages.stream(model="m", max_tokens=3, messages=hi) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text.split()) == 3 and final.content[0].text == text
    assert final.stop_reason == "max_tokens"
    stored = Request.objects.order_by("created_at")
    assert [(r.kind, r.state) for r in stored] == [("message", State.COMPLETED)] * 2
    assert messages_api.message_text(stored[1].result) == text
    assert stored[1].result["usage"]["output_tokens"] == 3
    # On the wire, as Anthropic's own: it ends with `message_stop`, no `[DONE]` after it.
    body = {"model": "m", "max_tokens": 2, "stream": True, "messages": hi}
    raw = httpx.post(f"{live.url}/v1/messages", headers={"x-api-key": key}, json=body).text
    assert raw.endswith('event: message_stop\ndata: {"type": "message_stop"}\n\n'), raw[-200:]


def test_the_key_is_required_as_anthropics_clients_send_it(live, make_key):
    with pytest.raises(anthropic.AuthenticationError):
        client(live, "sy-not.a-key").messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert not Request.objects.exists()
    # The models too, as those clients ask for them.
    models = httpx.get(f"{live.url}/v1/models", headers={"x-api-key": make_key()})
    assert [m["id"] for m in models.json()["data"]] == ["m"]
    refused = httpx.get(f"{live.url}/v1/models", headers={"x-api-key": "sy-not.a-key"})
    assert refused.status_code == 401


def test_a_system_turn_mid_conversation_is_taken(live, make_key):
    """Claude Code sends system turns among the messages (Anthropic's
    `mid-conversation-system` beta): taken, and asked of the server as they came."""
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "system", "content": "Available agent types: claude."},
    ]
    headers = {"x-api-key": make_key(), "anthropic-beta": "mid-conversation-system-2026-04-07"}
    answer = httpx.post(
        f"{live.url}/v1/messages?beta=true",
        headers=headers,
        json={"model": "m", "max_tokens": 2, "messages": turns},
    )
    assert answer.status_code == 200, answer.text
    assert Request.objects.get().payload["messages"] == turns


def test_a_messages_tokens_counted_through_the_scheduler(live, make_key):
    """`POST /v1/messages/count_tokens` (Anthropic's clients add `?beta=true`): a
    request like any other, sent to a server that has the model; the simulated one counts
    words. It is no usage: nothing was generated and its tokens are not spent."""
    c = client(live, make_key())
    counted = c.messages.count_tokens(
        model="m", system="Be brief.", messages=[{"role": "user", "content": "hi there"}]
    )
    assert counted.input_tokens == 4
    answer = httpx.post(
        f"{live.url}/v1/messages/count_tokens?beta=true",
        headers={"x-api-key": make_key("claude")},
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "a b c"}]},
    )
    assert answer.status_code == 200 and answer.json() == {"input_tokens": 3}  # never streamed
    stored = Request.objects.order_by("created_at")
    assert [(r.kind, r.state) for r in stored] == [("count_tokens", State.COMPLETED)] * 2
    assert [r.stream for r in stored] == [False, False]
    today = datetime.now(UTC).date()
    report = usage.report(today - timedelta(days=1), today, by=("key",))
    assert [(row["requests"], row["prompt_tokens"]) for row in report] == [(1, 0), (1, 0)]
    refused = httpx.post(
        f"{live.url}/v1/messages/count_tokens",
        headers={"x-api-key": make_key()},
        json={"model": "m", "messages": [{"role": "tool", "content": "x"}]},
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[0].role"
    assert Request.objects.count() == 2


def test_anthropics_client_lists_the_llms_in_its_own_shape(live, make_key):
    """Anthropic's clients send `anthropic-version`: the list and one model come in
    Anthropic's shape, LLMs only (a message cannot ask an embedding model); OpenAI's
    clients still see every type in OpenAI's."""
    factories.deployment(factories.server("sim2"), "emb")
    Model.objects.filter(name="emb").update(type=ModelType.EMBEDDING)
    Model.objects.filter(name="m").update(aliases=["mm"])
    key = make_key()
    page = client(live, key).models.list()
    assert [(m.id, m.type, m.display_name) for m in page.data] == [
        ("m", "model", "m"),
        ("mm", "model", "mm"),
    ]
    assert (page.has_more, page.first_id, page.last_id) == (False, "m", "mm")
    assert page.data[0].created_at.year == 1970
    one = client(live, key).models.retrieve("mm")
    assert (one.id, one.type) == ("mm", "model")
    openai_shape = httpx.get(f"{live.url}/v1/models", headers={"x-api-key": key}).json()
    assert [(m["id"], m["type"]) for m in openai_shape["data"]] == [
        ("emb", "embedding"),
        ("m", "llm"),
        ("mm", "llm"),
    ]


def test_bad_input_is_a_400_that_stores_nothing(live, make_key):
    headers = {"x-api-key": make_key()}
    hi = [{"role": "user", "content": "hi"}]
    bad = [
        ({"model": "m"}, "messages", "missing"),
        ({"model": "m", "messages": []}, "messages", "missing"),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].role",
            None,
        ),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", None),
        ({"model": "m", "messages": hi, "system": 5}, "system", "invalid_type"),
        ({"model": "m", "messages": hi, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ]
    for body, param, code in bad:
        answer = httpx.post(f"{live.url}/v1/messages", json=body, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.json()["type"] == "error", answer.text  # Anthropic's shape
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error", error
        assert error["param"] == param and (code is None or error["code"] == code), error
    assert not Request.objects.exists()


def test_errors_come_in_anthropics_shape_as_its_client_reads_them(live, make_key):
    """Before a message is stored or its stream opens, and as a stream's last event: the
    shape and error types of Anthropic's API (`{"type": "error", "error": {"type",
    "message"}}`), so that its clients raise the right error with the message."""
    key = make_key()
    c = client(live, key)
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as missing:
        c.messages.create(model="nope", max_tokens=2, messages=hi)
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert "nope" in missing.value.message
    streamed = c.messages.stream(model="nope", max_tokens=2, messages=hi)
    with pytest.raises(anthropic.NotFoundError), streamed as stream:
        stream.get_final_message()
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client(live, "sy-not.a-key").messages.count_tokens(model="m", messages=hi)
    assert refused.value.body["error"]["type"] == "authentication_error"
    wrong = httpx.get(f"{live.url}/v1/messages", headers={"x-api-key": make_key()})
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    assert not Request.objects.exists()
    # A message its server refuses, streamed: the stream's last event is a named `error`
    # event, which Anthropic's client raises (it read an unnamed one as nothing, and the
    # stream's end without a message as its own failure).
    refusing = Upstream(["m2"])
    refusing.fail_next = [(400, "request (8054 tokens) exceeds the available context size")]
    try:
        srv = factories.server("refusing", kind="openai", base_url=refusing.url)
        factories.deployment(srv, "m2", state="loaded")
        streamed = c.messages.stream(model="m2", max_tokens=2, messages=hi)
        with pytest.raises(anthropic.APIStatusError) as failed, streamed as stream:
            stream.get_final_message()
        refusing.fail_next = [(400, "request (8054 tokens) exceeds the available context size")]
        body = {"model": "m2", "max_tokens": 2, "stream": True, "messages": hi}
        raw = httpx.post(f"{live.url}/v1/messages", headers={"x-api-key": key}, json=body).text
    finally:
        refusing.close()
    assert failed.value.body["error"]["type"] == "invalid_request_error", failed.value.body
    assert "exceeds the available context size" in failed.value.body["error"]["message"]
    assert raw.split("\n\n")[-2].startswith("event: error\n"), raw  # and nothing after it
    assert [r.state for r in Request.objects.all()] == [State.FAILED] * 2
    Request.objects.all().delete()
    # OpenAI's paths keep OpenAI's shape.
    chat = httpx.post(
        f"{live.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {make_key()}"},
        json={"model": "nope", "messages": hi},
    )
    assert chat.status_code == 404 and "type" not in chat.json(), chat.text


def test_a_streams_events_fold_into_the_message_and_its_text():
    folded = messages_api.Message()
    for event in EVENTS:
        folded.add(event)
    message = folded.result()
    assert message["content"] == [
        {"type": "text", "text": "Hi you"},
        {"type": "tool_use", "id": "t1", "name": "look", "input": {"city": "Oslo"}},
    ]
    assert (message["stop_reason"], message["usage"]) == (
        "tool_use",
        {"input_tokens": 9, "output_tokens": 5},
    )
    assert text_of(EVENTS) == "Hi you" == messages_api.message_text(message)
    assert answer_text(message) == "Hi you"  # as the dashboard and the watch page show it


def test_a_caller_that_missed_the_end_gets_the_rest_and_the_stop():
    folded = messages_api.Message()
    for event in EVENTS[:5]:
        folded.add(event)
    message = folded.result() | {"stop_reason": "end_turn"}
    seen = CatchUp()
    assert seen.relay({"chunks": EVENTS[:3], "at": 0, "n": 0})
    rest = seen.ending(message, "r")
    assert [e["type"] for e in rest] == ["content_block_delta", "message_delta", "message_stop"]
    assert rest[0]["delta"]["text"] == " you" and rest[1]["delta"]["stop_reason"] == "end_turn"
    assert seen.relay({"chunks": EVENTS[3:], "at": len("Hi"), "n": 1})
    assert seen.ending(message, "r") == []


def test_a_run_begun_again_goes_on_from_the_callers_place_in_its_blocks():
    """Another worker ran it again from the start: its events up to what the caller saw
    are not sent twice (no second message_start); the rest goes on in the same blocks."""
    seen = CatchUp()
    seen.relay({"chunks": EVENTS[:3], "at": 0, "n": 0})  # "Hi"
    delta = {"type": "content_block_delta", "index": 0}
    again = [*EVENTS[:2], delta | {"delta": {"type": "text_delta", "text": "H"}}]
    assert seen.relay({"chunks": again, "at": 0, "n": 0}) == []
    went_on = delta | {"delta": {"type": "text_delta", "text": "i you"}}
    assert seen.relay({"chunks": [went_on, *EVENTS[4:]], "at": 1, "n": 1}) == [
        delta | {"delta": {"type": "text_delta", "text": " you"}},
        *EVENTS[4:],
    ]
    assert seen.saw_end and seen.text == "Hi you"


def test_a_run_begun_again_before_any_text_sends_no_second_message_start():
    """The worker's process exited while the model read the prompt: the caller saw the
    message begin and its first block open, nothing more. The second run's own two are not
    sent again; its text goes on in the caller's block."""
    seen = CatchUp()
    seen.relay({"chunks": EVENTS[:2], "at": 0, "n": 0})
    assert seen.relay({"chunks": EVENTS[:2], "at": 0, "n": 0}) == []
    assert seen.relay({"chunks": EVENTS[2:4], "at": 0, "n": 1}) == EVENTS[2:4]
    only_start = CatchUp()  # it saw the message begin, not its block
    only_start.relay({"chunks": EVENTS[:1], "at": 0, "n": 0})
    assert only_start.relay({"chunks": EVENTS[:3], "at": 0, "n": 0}) == EVENTS[1:3]

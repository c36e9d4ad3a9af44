"""`POST /v1/responses`, OpenAI's Responses API: answered and streamed through the scheduler
(the OpenAI client reads both), queued and accounted as a chat is; its stream ends with its
last event, not [DONE]; a caller that missed the end gets it from the stored response; bad
input is a 400 that stores nothing. The real llama-server's side is in
tests/integration/test_real_llama_single.py."""

from datetime import timedelta

import httpx
import openai
import pytest
from django.utils import timezone

from access import usage
from access.models import ApiKey
from backends import responses_api
from scheduler.models import Request, State
from scheduler.streams import CatchUp, answer_text, text_of
from tests import factories

DELTA = responses_api.TEXT_DELTA
RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello there"}],
        }
    ],
    "usage": {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11},
}
EVENTS = [
    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
    {"type": DELTA, "delta": "Hello"},
    {"type": DELTA, "delta": " there"},
    {"type": "response.completed", "response": RESPONSE},
]


@pytest.fixture
def live(served):
    factories.deployment(factories.server("sim"), "m")
    return served()


def openai_client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def test_a_response_answered_and_streamed_through_the_scheduler(live):
    answer = openai_client(live).responses.create(model="m", input="hi", max_output_tokens=4)
    assert answer.object == "response" and len(answer.output_text.split()) == 4
    assert answer.usage.output_tokens == 4
    # The simulated model runs to the cap it is given: cut short, and saying why.
    assert (answer.status, answer.incomplete_details.reason) == ("incomplete", "max_output_tokens")

    events = list(openai_client(live).responses.create(model="m", input="hi", stream=True))
    assert [e.type for e in events][-1] == "response.completed"
    assert (events[-1].response.status, events[-1].response.incomplete_details) == (
        "completed",
        None,
    )
    cut = openai_client(live).responses.create(
        model="m", input="hi", max_output_tokens=2, stream=True
    )
    last = list(cut)[-1]
    assert (last.type, last.response.incomplete_details.reason) == (
        "response.incomplete",
        "max_output_tokens",
    )
    deltas = "".join(e.delta for e in events if e.type == DELTA)
    assert deltas == events[-1].response.output_text
    stored = Request.objects.order_by("created_at")
    assert [(r.kind, r.state) for r in stored] == [("response", State.COMPLETED)] * 3
    assert stored[1].result == events[-1].response.model_dump(exclude_unset=True)
    # On the wire, as OpenAI's own: it ends with its last event, no `[DONE]` after it.
    body = {"model": "m", "input": "hi", "stream": True}
    raw = httpx.post(f"{live.url}/v1/responses", json=body).text
    assert raw.split("\n\n")[-2].startswith("event: response.completed\n"), raw[-300:]


def test_a_response_job_through_the_jobs_api(live):
    job = {"kind": "response", "body": {"model": "m", "input": "hi", "max_output_tokens": 2}}
    sent = httpx.post(f"{live.url}/api/v1/requests", json=job)
    assert sent.status_code == 202, sent.text
    done = httpx.get(live.url + sent.headers["Location"], params={"wait_s": 30}).json()
    assert (done["kind"], done["state"]) == ("response", "completed")
    assert done["result"]["object"] == "response"


def test_bad_input_is_a_400_that_stores_nothing(live):
    bad = [
        ({"model": "m"}, "input", "missing"),
        ({"model": "m", "input": ""}, "input", "missing"),
        ({"model": "m", "input": []}, "input", "missing"),
        ({"model": "m", "input": 5}, "input", "invalid_type"),
        (
            {"model": "m", "input": "hi", "max_output_tokens": 0},
            "max_output_tokens",
            "invalid_value",
        ),
        (
            {"model": "m", "input": "hi", "max_output_tokens": "ten"},
            "max_output_tokens",
            "invalid_type",
        ),
    ]
    for body, param, code in bad:
        answer = httpx.post(f"{live.url}/v1/responses", json=body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["param"], error["code"]) == (param, code), error
    assert not Request.objects.exists()


def test_a_caller_that_missed_the_end_gets_the_rest_and_the_response():
    seen = CatchUp()
    assert seen.relay({"chunks": EVENTS[:2], "at": 0, "n": 0})
    assert seen.ending(RESPONSE, "r") == [
        {"type": DELTA, "delta": " there"},
        {"type": "response.completed", "response": RESPONSE},
    ]
    assert seen.relay({"chunks": EVENTS[2:], "at": len("Hello"), "n": 1})
    assert seen.ending(RESPONSE, "r") == []  # it saw it all
    other = CatchUp()
    other.relay({"chunks": [{"type": DELTA, "delta": "Goodbye"}], "at": 0})
    assert other.ending(RESPONSE, "r")[0]["error"]["code"] == "stream_diverged"


def test_a_run_begun_again_goes_on_from_the_callers_place():
    seen = CatchUp()
    seen.relay({"chunks": EVENTS[:2], "at": 0, "n": 0})  # "Hello"
    assert seen.relay({"chunks": EVENTS[:1], "at": 0, "n": 0}) == []
    again = [{"type": DELTA, "delta": "Hello th"}, *EVENTS[3:]]
    went_on = seen.relay({"chunks": again, "at": 0, "n": 1})
    assert went_on == [{"type": DELTA, "delta": " th"}, *EVENTS[3:]]


def test_text_tokens_and_the_dashboards_answer_of_a_response(db):
    assert text_of(EVENTS) == "Hello there" == answer_text(RESPONSE)
    alice, _ = ApiKey.generate("alice")
    alice.save()
    r = factories.request("m", kind="response", api_key=alice)
    now = timezone.now()
    Request.objects.filter(pk=r.pk).update(
        state=State.COMPLETED,
        started_at=now - timedelta(seconds=1),
        finished_at=now,
        result=RESPONSE,
    )
    figures = usage.usage(alice.pk)[alice.pk, now.date()]
    assert (figures["prompt_tokens"], figures["completion_tokens"]) == (9, 2)


def test_a_messages_prompt_counts_what_came_from_the_prompt_cache(db):
    """Anthropic's `input_tokens` leave out the cached part of the prompt (Claude Code's
    16,000-token prompt on llama-server: 1 input token), which a chat's `prompt_tokens`
    hold: both count in the key's prompt tokens, as the same prompt asked as a chat would."""
    alice, _ = ApiKey.generate("alice")
    alice.save()
    now = timezone.now()
    results = [
        {
            "type": "message",
            "usage": {"input_tokens": 1, "cache_read_input_tokens": 15740, "output_tokens": 16},
        },
        {
            "type": "message",
            "usage": {"input_tokens": 5, "cache_creation_input_tokens": 20, "output_tokens": 1},
        },
        {"type": "message", "usage": {"input_tokens": 7, "output_tokens": 2}},
        {"object": "chat.completion", "usage": {"prompt_tokens": 15741, "completion_tokens": 3}},
    ]
    for result in results:
        r = factories.request("m", kind="message", api_key=alice)
        Request.objects.filter(pk=r.pk).update(
            state=State.COMPLETED, started_at=now, finished_at=now, result=result
        )
    figures = usage.usage(alice.pk)[alice.pk, now.date()]
    assert (figures["prompt_tokens"], figures["completion_tokens"]) == (
        15741 + 25 + 7 + 15741,
        16 + 1 + 2 + 3,
    )

"""OpenAI's Batch API through a live Switchyard, driven by the OpenAI client as an app
would: upload a JSONL file, create a batch, poll it, read its output file."""

import json

import openai
import pytest

from batches.models import Batch, File
from scheduler.models import Priority, Request, State
from tests import factories
from tests.support.polling import eventually


def chat_line(custom_id: str, model: str = "m1", **changes) -> dict:
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": custom_id}]},
    }
    return line | changes


def jsonl(*lines) -> bytes:
    return "".join(f"{json.dumps(line)}\n" for line in lines).encode()


def client(live, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def live(served, gated_upstream):
    """Two slots on an upstream whose gate is open: every request is answered at once."""
    up = factories.server("up", kind="openai", base_url=gated_upstream.url, slots=2)
    factories.deployment(up, "m1", state="loaded")
    gated_upstream.gate.set()
    return served()


def test_a_batch_runs_its_lines_as_background_requests_and_writes_their_answers(live):
    c = client(live)
    sent = jsonl(*map(chat_line, "abc"))
    uploaded = c.files.create(file=("in.jsonl", sent), purpose="batch")
    assert (uploaded.purpose, uploaded.filename, uploaded.bytes) == ("batch", "in.jsonl", len(sent))
    batch = c.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 3
    eventually(lambda: c.batches.retrieve(batch.id).status == "completed")
    done = c.batches.retrieve(batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.error_file_id is None and done.metadata == {"job": "nightly"}
    assert done.completed_at >= done.created_at
    answers = [json.loads(line) for line in c.files.content(done.output_file_id).text.splitlines()]
    assert [a["custom_id"] for a in answers] == ["a", "b", "c"]
    for a in answers:
        assert a["response"]["status_code"] == 200 and a["error"] is None
        assert a["response"]["body"]["choices"][0]["message"]["content"] == "Hello from upstream"
    stored = Request.objects.all()
    assert {(r.priority, r.state) for r in stored} == {(Priority.BACKGROUND, State.COMPLETED)}
    assert [b.id for b in c.batches.list()] == [batch.id]
    assert c.files.retrieve(done.output_file_id).purpose == "batch_output"


@pytest.mark.parametrize(
    "lines, says",
    [
        ([b"not json\n"], "Line 1 is not JSON."),
        ([jsonl(chat_line("a")), jsonl(chat_line("a"))], "Line 2: custom_id `a` is already used"),
        ([jsonl({"method": "POST"})], "Line 1: custom_id must be a string"),
        ([jsonl(chat_line("a", url="/v1/embeddings"))], "Line 1: url must be the batch's endpoint"),
        ([jsonl(chat_line("a", model="ghost"))], "Line 1: The model `ghost` does not exist."),
        ([jsonl(chat_line("a", body={"model": "m1"}))], "Line 1: messages must be a non-empty"),
        ([b"\n\n"], "holds no requests"),
    ],
)
def test_a_bad_line_refuses_the_whole_batch_naming_it(live, lines, says):
    c = client(live)
    uploaded = c.files.create(file=("in.jsonl", b"".join(lines)), purpose="batch")
    with pytest.raises(openai.APIStatusError) as refused:
        c.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert refused.value.status_code in (400, 404)
    assert says in refused.value.body["message"]
    assert refused.value.body["param"] == "input_file_id"
    assert not Batch.objects.exists() and not Request.objects.exists()


def test_files_are_listed_read_and_deleted(live):
    c = client(live)
    uploaded = c.files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch")
    assert [f.id for f in c.files.list()] == [uploaded.id]
    content = c.files.content(uploaded.id)
    assert json.loads(content.text)["custom_id"] == "a"
    # A download: a browser neither renders nor sniffs what a caller uploaded.
    assert content.response.headers["X-Content-Type-Options"] == "nosniff"
    assert content.response.headers["Content-Disposition"].startswith("attachment")
    assert c.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError) as gone:
        c.files.retrieve(uploaded.id)
    assert gone.value.body["code"] == "file_not_found"
    assert not File.objects.exists()


@pytest.mark.auth
def test_a_key_sees_only_its_own_files_and_batches(served, gated_upstream, make_key):
    up = factories.server("up", kind="openai", base_url=gated_upstream.url, slots=1)
    factories.deployment(up, "m1", state="loaded")
    live = served(SWITCHYARD_AUTH="required")
    alice, bob = client(live, make_key("alice")[1]), client(live, make_key("bob")[1])
    uploaded = alice.files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch")
    batch = alice.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for call in (
        lambda: bob.files.retrieve(uploaded.id),
        lambda: bob.files.content(uploaded.id),
        lambda: bob.files.delete(uploaded.id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(bob.files.list()) == [] and list(bob.batches.list()) == []
    assert [b.id for b in alice.batches.list()] == [batch.id]
    with pytest.raises(openai.AuthenticationError):
        client(live, "sy-12345678.nope").batches.list()


def test_cancelling_a_batch_stops_its_request_at_the_server(served, gated_upstream):
    """One slot, held at the gate by the batch's first request: cancel stops that call and
    cancels the others waiting; the batch is then `cancelled`, with every line an error."""
    up = factories.server("up", kind="openai", base_url=gated_upstream.url, slots=1)
    factories.deployment(up, "m1", state="loaded")
    c = client(served())
    uploaded = c.files.create(file=("in.jsonl", jsonl(*map(chat_line, "abc"))), purpose="batch")
    batch = c.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert gated_upstream.arrived.wait(30)
    assert c.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    assert gated_upstream.hung_up.wait(30), "the call to the server was not closed"
    eventually(lambda: c.batches.retrieve(batch.id).status == "cancelled")
    ended = c.batches.retrieve(batch.id)
    assert ended.output_file_id is None and ended.cancelled_at is not None
    errors = [json.loads(x) for x in c.files.content(ended.error_file_id).text.splitlines()]
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 3
    assert set(Request.objects.values_list("state", flat=True)) == {State.CANCELLED}


def test_lists_are_paged_newest_first_after_an_id(live):
    c = client(live)
    made = [
        c.files.create(file=(f"{i}.jsonl", jsonl(chat_line("a"))), purpose="batch").id
        for i in range(3)
    ]
    first = c.files.list(limit=2)
    assert [f.id for f in first.data] == made[:0:-1] and first.has_more
    rest = c.files.list(limit=2, after=first.data[-1].id)
    assert [f.id for f in rest.data] == made[:1] and not rest.has_more
    with pytest.raises(openai.BadRequestError) as refused:
        c.files.list(limit=0)
    assert refused.value.body["param"] == "limit"


def test_a_batch_of_responses(served):
    """`/v1/responses` lines (OpenAI's Responses API) run as background responses."""
    factories.deployment(factories.server("sim"), "m2")
    c = client(served())
    line = {"method": "POST", "url": "/v1/responses", "body": {"model": "m2", "input": "hi"}}
    sent = jsonl(*({"custom_id": name, **line} for name in "ab"))
    uploaded = c.files.create(file=("in.jsonl", sent), purpose="batch")
    batch = c.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
    )
    eventually(lambda: c.batches.retrieve(batch.id).status == "completed")
    done = c.batches.retrieve(batch.id)
    answers = [json.loads(line) for line in c.files.content(done.output_file_id).text.splitlines()]
    assert [a["response"]["body"]["object"] for a in answers] == ["response", "response"]
    assert {r.kind for r in Request.objects.all()} == {"response"}


def test_a_batch_of_anthropic_messages(served):
    """`/v1/messages` lines (Anthropic's Messages API) run as background messages."""
    factories.deployment(factories.server("sim"), "m3")
    c = client(served())
    body = {"model": "m3", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    line = {"method": "POST", "url": "/v1/messages", "body": body}
    uploaded = c.files.create(file=("in.jsonl", jsonl({"custom_id": "a", **line})), purpose="batch")
    batch = c.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/messages", completion_window="24h"
    )
    eventually(lambda: c.batches.retrieve(batch.id).status == "completed")
    done = c.batches.retrieve(batch.id)
    [answer] = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert answer["response"]["body"]["type"] == "message"
    assert Request.objects.get().kind == "message"

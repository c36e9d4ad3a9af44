"""The API through a live Switchyard (`manage.py serve`), with the official openai client."""

import json
import re
import threading
import uuid

import httpx
import openai
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from backends.models import Server
from scheduler.models import Request, State
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.polling import eventually


@pytest.fixture
def upstream():
    up = Upstream(["qwen-upstream"])
    yield up
    up.close()


@pytest.fixture
def deployed(transactional_db, upstream):
    srv = factories.server("up", kind="openai", base_url=upstream.url, slots=4)
    factories.model("qwen", aliases=["q"])
    # Loaded as the worker's first status sync would find it, so that no test races it.
    factories.deployment(srv, "qwen", server_model_id="qwen-upstream", state="loaded")


@pytest.fixture
def live(served, deployed):
    return served()


def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def test_chat_completion_with_openai_client(live, upstream):
    answer = client(live).chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "Hello from upstream"
    assert upstream.received[-1]["body"]["model"] == "qwen-upstream"
    request = Request.objects.get()
    assert request.state == State.COMPLETED
    assert [t.to_state for t in request.traces.all()] == ["ready", "processing", "completed"]


def test_streamed_chat_with_openai_client(live):
    chunks = client(live).chat.completions.create(
        model="q", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from upstream"
    assert Request.objects.get().result["choices"][0]["message"]["content"] == text


class RedisCommands:
    """The commands Redis runs from now until `stop`, as MONITOR shows them. MONITOR is
    server-wide: a test picks its own processes' by the channel prefix they name."""

    def __init__(self) -> None:
        self.end = f"end-{uuid.uuid4()}"
        self.seen: list[str] = []
        self.monitor = redis.Redis.from_url(settings.REDIS_URL).monitor()
        self.monitor.__enter__()  # MONITOR answered: every command from here on is seen
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        while self.end not in (command := self.monitor.next_command()["command"]):
            self.seen.append(command)

    def stop(self) -> list[str]:
        """What was seen, up to an ECHO sent now (seen last: commands are seen in order)."""
        redis.Redis.from_url(settings.REDIS_URL).echo(self.end)
        self.reader.join(timeout=30)
        self.monitor.__exit__(None, None, None)
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        return [c for c in self.seen if prefix in c]


@pytest.mark.skipif(not settings.REDIS_URL, reason="Redis pub/sub")
@pytest.mark.usefixtures("deployed")
def test_callers_hear_their_answers_with_no_subscription_per_request(served):
    # No re-read of the row to fall back on within the test: every answer comes by its hint.
    live = served(SWITCHYARD_WAITING_COMMENT_S="60")
    c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=10)
    hi = [{"role": "user", "content": "hi"}]
    c.chat.completions.create(model="qwen", messages=hi)  # the process starts listening
    commands = RedisCommands()

    for _ in range(3):
        assert c.chat.completions.create(model="qwen", messages=hi).choices
        chunks = c.chat.completions.create(model="qwen", messages=hi, stream=True)
        assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)

    seen = commands.stop()
    assert any(c.upper().startswith("PUBLISH") for c in seen)  # the answers' hints
    subscribing = ("SUBSCRIBE", "UNSUBSCRIBE", "PSUBSCRIBE", "PUNSUBSCRIBE")
    assert not [c for c in seen if c.upper().startswith(subscribing)]


def test_embeddings_and_completions(live):
    srv = Server.objects.get(name="up")
    factories.model("emb", type="embedding")
    factories.deployment(srv, "emb", server_model_id="qwen-upstream", state="loaded")
    c = client(live)
    assert c.embeddings.create(model="emb", input="hi").data[0].embedding == [0.1, 0.2]
    assert c.completions.create(model="qwen", prompt="hi").choices[0].text == "Hello from upstream"


def test_models_lists_names_and_aliases(live):
    ids = [m.id for m in client(live).models.list()]
    assert ids == ["qwen", "q"]


def test_a_model_no_server_serves_is_neither_listed_nor_found(live):
    """A request for it is refused (404 `model_not_deployed`), so it is not offered: left
    behind by a removed server (the demo's models after `apply_config --prune` of a file
    with no `models` list), or not deployed yet."""
    factories.model("homeless", aliases=["h"])
    c = client(live)
    assert [m.id for m in c.models.list()] == ["qwen", "q"]
    for name in ["homeless", "h"]:
        with pytest.raises(openai.NotFoundError) as err:
            c.models.retrieve(name)
        assert err.value.body["code"] == "model_not_deployed"
        assert "no server has a deployment of homeless" in err.value.body["message"]
    factories.deployment(Server.objects.get(name="up"), "homeless")
    assert [m.id for m in c.models.list()] == ["homeless", "h", "qwen", "q"]
    assert c.models.retrieve("h").id == "h"


def test_one_model_by_name_or_alias_as_the_list_shows_it(live):
    c = client(live)
    for name in ["qwen", "q"]:
        model = c.models.retrieve(name)
        assert (model.id, model.object, model.owned_by) == (name, "model", "switchyard")
    with pytest.raises(openai.NotFoundError) as err:
        c.models.retrieve("nope")
    assert err.value.body["code"] == "model_not_found"
    # Names with slashes and colons, as Hugging Face and Ollama write them.
    factories.deployment(Server.objects.get(name="up"), "org/qwen3:8b")
    assert c.models.retrieve("org/qwen3:8b").id == "org/qwen3:8b"


def test_each_model_says_whether_a_server_holds_it_loaded_now(live):
    """An app can pick a model that answers without waiting for a load: `loaded`, true
    while some server holds it loaded (as Ollama's `/api/ps` lists them)."""
    up = Server.objects.get(name="up")
    cold = factories.deployment(up, "cold")
    c = client(live)
    listed = {m.id: m.to_dict()["loaded"] for m in c.models.list()}
    assert listed == {"cold": False, "qwen": True, "q": True}
    assert c.models.retrieve("cold").to_dict()["loaded"] is False
    # The worker's first status sync (the upstream does not list `cold`) is over before
    # `cold` is marked loaded, as a load would: it would otherwise undo the mark.
    eventually(lambda: Server.objects.get(name="up").last_seen, what="the first status sync")
    cold.state, cold.state_changed_at = "loaded", timezone.now()
    cold.save()
    assert c.models.retrieve("cold").to_dict()["loaded"] is True


@pytest.mark.parametrize("name", ["nope", "n" * 10_000], ids=["unknown", "too-long"])
def test_unknown_model_is_404_in_openai_shape_and_stores_nothing(live, name):
    with pytest.raises(openai.NotFoundError) as err:
        client(live).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.body["code"] == "model_not_found"
    assert Request.objects.count() == 0


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        (b'{"messages": []}', "model"),
        (b'{"model": "qwen"}', "messages"),
        (
            b'{"model": "qwen", "messages": [{"role": "user", "content": "x"}], "priority": "vip"}',
            "priority",
        ),
    ],
)
def test_bad_input_is_400_and_changes_nothing(live, body, param):
    r = httpx.post(f"{live.url}/v1/chat/completions", content=body)
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["param"] == param
    assert Request.objects.count() == 0


def test_other_methods_are_405_in_openai_shape(live):
    r = httpx.get(f"{live.url}/v1/chat/completions")
    assert r.status_code == 405
    assert r.headers["Allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_a_body_over_the_upload_limit_is_413_and_changes_nothing(live):
    content = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    body = {"model": "qwen", "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert Request.objects.count() == 0


def test_jobs_api_submit_poll_and_trace(live):
    body = {
        "kind": "chat",
        "priority": "high",
        "body": {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
    }
    r = httpx.post(f"{live.url}/api/v1/requests", json=body)
    assert r.status_code == 202
    assert r.headers["Location"] == f"/api/v1/requests/{r.json()['id']}"
    url = live.url + r.headers["Location"]
    detail = httpx.get(url, params={"wait_s": 30}).json()
    assert detail["priority"] == "high"
    assert detail["state"] == "completed"
    assert detail["server"] == "up"
    assert [t["to_state"] for t in detail["trace"]][-1] == "completed"


def test_jobs_api_unknown_id_and_cancel_rules(live):
    r = httpx.get(f"{live.url}/api/v1/requests/00000000-0000-0000-0000-000000000000")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "request_not_found"


def test_x_priority_header_is_honoured(live):
    httpx.post(
        f"{live.url}/v1/chat/completions",
        headers={"X-Priority": "interactive"},
        json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert Request.objects.get().priority == 0


def test_streamed_relay_ends_with_done(live):
    with httpx.stream(
        "POST",
        f"{live.url}/v1/chat/completions",
        timeout=30,
        json={"model": "qwen", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][5:])["choices"][0]["delta"]["content"] == "Hello"


def test_a_waiting_request_says_why_in_the_api_and_in_its_stream(served):
    """Its model's one server is disabled: the worker's pass stores why it waits, and the
    jobs API (one and the list) and the waiting SSE comment of a streamed call say it."""
    factories.deployment(factories.server("off", enabled=False), "parked")
    live = served(SWITCHYARD_NO_SERVER_GRACE_S="120")
    hi = {"model": "parked", "messages": [{"role": "user", "content": "hi"}]}
    job = httpx.post(f"{live.url}/api/v1/requests", json={"body": hi}).json()
    why = "no server can serve parked: off is disabled; fails at "
    with httpx.stream(
        "POST", f"{live.url}/v1/chat/completions", json={**hi, "stream": True}, timeout=30
    ) as r:
        comment = next(line for line in r.iter_lines() if why in line)
    assert re.match(
        r": waiting, pending, position 2(, sent (in ~\d+ s|any moment))?: " + why, comment
    )
    detail = httpx.get(f"{live.url}/api/v1/requests/{job['id']}").json()
    assert detail["reason"]["kind"] == "no_server"
    assert detail["reason"]["text"].startswith(why)
    assert "until" in detail["reason"]["details"]
    listed = httpx.get(f"{live.url}/api/v1/requests", params={"state": "pending"}).json()
    assert [item["reason"]["kind"] for item in listed["data"]] == ["no_server"]
    httpx.delete(f"{live.url}/api/v1/requests/{job['id']}")
    assert httpx.get(f"{live.url}/api/v1/requests/{job['id']}").json()["reason"] is None

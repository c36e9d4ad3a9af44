"""The API through a live Switchyard with SWITCHYARD_AUTH=required, as a caller sees it."""

import time

import httpx
import openai
import pytest

from access import limits
from access.models import Team
from scheduler.models import Request
from tests import factories
from tests.access.conftest import bearer
from tests.support.openai_upstream import Upstream
from tests.support.polling import eventually

pytestmark = pytest.mark.auth
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def upstream():
    up = Upstream(["qwen-upstream"])
    yield up
    up.close()


@pytest.fixture
def live(served, upstream, make_key):
    srv = factories.server("up", kind="openai", base_url=upstream.url, slots=4)
    factories.model("qwen", aliases=["q"])
    factories.model("other")
    factories.deployment(srv, "qwen", server_model_id="qwen-upstream", state="loaded")
    factories.deployment(srv, "other", server_model_id="qwen-upstream", state="loaded")
    return served(SWITCHYARD_AUTH="required")


def client(live, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=secret, max_retries=0, timeout=30)


def test_without_a_good_key_nothing_is_served_or_stored(live, make_key):
    _, secret = make_key("alice", revoked=True)
    for headers in [{}, bearer("sy-12345678.nope"), bearer(secret)]:
        for method, path, body in [
            ("POST", "/v1/chat/completions", {"model": "qwen", "messages": HI}),
            ("POST", "/v1/embeddings", {"model": "qwen", "input": "x"}),
            ("GET", "/v1/models", None),
            ("GET", "/v1/models/qwen", None),
            ("POST", "/api/v1/requests", {"body": {"model": "qwen", "messages": HI}}),
            ("GET", "/api/v1/requests/00000000-0000-0000-0000-000000000000", None),
        ]:
            r = httpx.request(method, live.url + path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
    assert Request.objects.count() == 0


def test_a_key_is_served_and_told_its_class(live, make_key):
    api_key, secret = make_key("alice")
    raw = client(live, secret).chat.completions.with_raw_response.create(model="qwen", messages=HI)
    assert raw.parse().choices[0].message.content == "Hello from upstream"
    assert raw.headers["X-Switchyard-Priority"] == "normal"
    assert not [name for name in raw.headers if name.startswith("x-ratelimit-")]  # no limits
    assert Request.objects.get().api_key_id == api_key.pk


def test_a_request_above_the_keys_class_runs_at_its_cap_and_says_so(live, make_key):
    _, secret = make_key("batch", max_priority=2, default_priority=3)
    r = httpx.post(
        f"{live.url}/v1/chat/completions",
        headers={**bearer(secret), "X-Priority": "interactive"},
        json={"model": "qwen", "messages": HI},
        timeout=30,
    )
    assert r.status_code == 200 and r.headers["X-Switchyard-Priority"] == "normal"
    capped = Request.objects.get()
    assert capped.priority == 2
    assert "runs at normal" in capped.traces.first().reason
    r = httpx.post(
        f"{live.url}/api/v1/requests",
        headers=bearer(secret),
        json={"body": {"model": "qwen", "messages": HI}},
    )
    assert r.json()["priority"] == "background"  # the key's default class


def test_a_key_sees_and_uses_only_its_models(live, make_key):
    _, secret = make_key("alice", allowed_models=["qwen"])
    c = client(live, secret)
    assert [m.id for m in c.models.list()] == ["qwen", "q"]
    assert c.chat.completions.create(model="q", messages=HI).choices  # an alias of qwen
    for name in ["other", "no-such-model"]:
        with pytest.raises(openai.PermissionDeniedError) as err:
            c.chat.completions.create(model=name, messages=HI)
        assert err.value.body["code"] == "model_not_allowed"
    assert Request.objects.count() == 1
    assert c.models.retrieve("q").id == "q"
    for name in ["other", "no-such-model"]:  # as for a request: one answer for both
        with pytest.raises(openai.PermissionDeniedError) as err:
            c.models.retrieve(name)
        assert err.value.body["code"] == "model_not_allowed"
    _, everything = make_key("bob")
    assert [m.id for m in client(live, everything).models.list()] == ["other", "qwen", "q"]


def test_another_keys_request_is_not_found_like_an_unknown_one(live, make_key):
    _, alice = make_key("alice")
    _, bob = make_key("bob")
    job = {"body": {"model": "qwen", "messages": HI}}
    sent = httpx.post(f"{live.url}/api/v1/requests", headers=bearer(alice), json=job)
    url = live.url + sent.headers["Location"]
    assert httpx.get(url, headers=bearer(alice), params={"wait_s": 30}).json()["result"]
    unknown = httpx.get(
        f"{live.url}/api/v1/requests/00000000-0000-0000-0000-000000000000", headers=bearer(bob)
    )
    for method in ["GET", "DELETE"]:
        r = httpx.request(method, url, headers=bearer(bob))
        assert r.status_code == 404
        assert r.json()["error"]["code"] == unknown.json()["error"]["code"] == "request_not_found"
    assert Request.objects.get().state == "completed"


def test_a_key_over_its_rate_is_429_with_retry_after(live, make_key):
    """Each answer tells what is left of the minute in OpenAI's headers, a job's 202 too;
    the 429 says none is left and when one frees."""
    _, secret = make_key("alice", rpm=3)
    c = client(live, secret)
    left = []
    for _ in range(2):
        raw = c.chat.completions.with_raw_response.create(model="qwen", messages=HI)
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        left.append(raw.headers["x-ratelimit-remaining-requests"])
    job = {"body": {"model": "qwen", "messages": HI}}
    sent = httpx.post(f"{live.url}/api/v1/requests", headers=bearer(secret), json=job)
    left.append(sent.headers["x-ratelimit-remaining-requests"])
    assert left == ["2", "1", "0"]
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(model="qwen", messages=HI)
    assert err.value.body["code"] == "rate_limited"
    headers = err.value.response.headers
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == limits.duration(int(headers["Retry-After"]))
    assert Request.objects.count() == 3


def test_a_key_over_its_daily_tokens_is_told_by_the_openai_client(live, make_key):
    """The upstream's answer uses 4 tokens: the first request is served, the next refused
    with nothing stored, and the OpenAI client is told not to retry at once."""
    _, secret = make_key("alice", daily_tokens=4)
    c = client(live, secret)
    c.chat.completions.create(model="qwen", messages=HI)
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(model="qwen", messages=HI)
    assert err.value.body["code"] == "insufficient_quota"
    assert "4 tokens, its quota of 4 a day" in err.value.body["message"]
    headers = err.value.response.headers
    assert headers["x-should-retry"] == "false"
    assert 1 <= int(headers["Retry-After"]) <= 86_400
    assert (headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"]) == (
        "4",
        "0",
    )
    assert Request.objects.count() == 1


def test_a_streamed_answer_counts_its_tokens_though_its_caller_did_not_ask_for_usage(
    live, make_key, upstream
):
    """A stream asked without `stream_options.include_usage` still counts against the daily
    token quota: Switchyard asks the server for the usage itself and stores it, and the
    caller gets the stream it asked for, without the usage-only chunk."""
    _, secret = make_key("alice", daily_tokens=4)
    c = client(live, secret)

    chunks = list(c.chat.completions.create(model="qwen", messages=HI, stream=True))

    assert all(chunk.choices for chunk in chunks)  # no usage-only chunk
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Hello from upstream"
    assert upstream.received[-1]["body"]["stream_options"] == {"include_usage": True}
    assert Request.objects.get().result["usage"]["total_tokens"] == 4
    with pytest.raises(openai.RateLimitError) as err:
        c.chat.completions.create(model="qwen", messages=HI, stream=True)
    assert err.value.body["code"] == "insufficient_quota"

    asked = {"include_usage": True}
    _, other = make_key("bob")
    told = list(
        client(live, other).chat.completions.create(
            model="qwen", messages=HI, stream=True, stream_options=asked
        )
    )
    assert told[-1].choices == [] and told[-1].usage.total_tokens == 4


def test_a_teams_daily_tokens_count_every_key_of_the_team(live, make_key):
    """Two keys of one team with 6 tokens a day between them (each answer uses 4): the
    first key's request is served, the second key's too (4 < 6), then neither key gets in,
    while a key in no team still does."""
    team = Team.objects.create(name="research", daily_tokens=6)
    _, first = make_key("alice", team=team)
    _, second = make_key("bob", team=team)
    _, outsider = make_key("carol")
    client(live, first).chat.completions.create(model="qwen", messages=HI)
    client(live, second).chat.completions.create(model="qwen", messages=HI)
    for secret in (first, second):
        with pytest.raises(openai.RateLimitError) as err:
            client(live, secret).chat.completions.create(model="qwen", messages=HI)
        assert err.value.body["code"] == "insufficient_quota"
        assert "The team research has used 8 tokens, its quota of 6" in err.value.body["message"]
    client(live, outsider).chat.completions.create(model="qwen", messages=HI)
    assert Request.objects.count() == 3


def test_a_script_provisions_a_team_and_a_key_and_revokes_it_over_http(served, upstream, make_key):
    """The operator API against a live Switchyard: a key made over HTTP in a team made over
    HTTP serves an OpenAI client at once, and its use counts as the team's; revoked, the key
    is refused (no auth cache here, so at once)."""
    srv = factories.server("up", kind="openai", base_url=upstream.url, slots=4)
    factories.deployment(srv, "qwen", server_model_id="qwen-upstream", state="loaded")
    live = served(SWITCHYARD_AUTH="required", SWITCHYARD_AUTH_CACHE_S="0")
    _, ops_secret = make_key("deploy-bot", operator=True)
    ops = bearer(ops_secret)
    team = httpx.post(
        f"{live.url}/api/v1/teams", headers=ops, json={"name": "research", "daily_tokens": 6}
    )
    assert team.status_code == 201, team.text
    made = httpx.post(
        f"{live.url}/api/v1/keys", headers=ops, json={"name": "chat-app", "team": "research"}
    )
    assert made.status_code == 201, made.text
    secret, prefix = made.json()["key"], made.json()["prefix"]
    answer = client(live, secret).chat.completions.create(model="qwen", messages=HI)
    assert answer.choices[0].message.content
    used = httpx.get(f"{live.url}/api/v1/teams/research", headers=ops).json()["used_today"]
    assert used["requests"] == 1 and used["completion_tokens"] + used["prompt_tokens"] == 4

    revoked = httpx.patch(f"{live.url}/api/v1/keys/{prefix}", headers=ops, json={"revoked": True})
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    with pytest.raises(openai.AuthenticationError):
        client(live, secret).chat.completions.create(model="qwen", messages=HI)


def test_a_key_with_too_many_waiting_is_429(live, make_key, gated_upstream):
    # One slot, held by the gate: the first request processes, the second waits.
    srv = factories.server("gated", kind="openai", base_url=gated_upstream.url, slots=1)
    factories.deployment(srv, "slow", server_model_id="m1", state="loaded")
    _, secret = make_key("alice", max_waiting=1)
    job = {"body": {"model": "slow", "messages": HI}}
    send = lambda: httpx.post(f"{live.url}/api/v1/requests", headers=bearer(secret), json=job)  # noqa: E731
    assert send().status_code == 202
    eventually(lambda: Request.objects.filter(state="processing").exists())
    assert send().status_code == 202
    r = send()
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_waiting"
    assert r.headers["Retry-After"]
    assert Request.objects.count() == 2


def test_a_key_revoked_is_refused_by_every_web_process_within_5_s(live, served, make_key):
    other = served(SWITCHYARD_AUTH="required")
    api_key, secret = make_key("alice")
    models = [f"{p.url}/v1/models" for p in (live, other)]
    for url in models:  # each process has checked the key, and trusts it for a while
        assert httpx.get(url, headers=bearer(secret)).status_code == 200
    api_key.revoked = True
    api_key.save()  # as the admin does, in one process (this one)
    revoked_at = time.monotonic()
    for url in models:
        eventually(lambda u=url: httpx.get(u, headers=bearer(secret)).status_code == 401)
    assert time.monotonic() - revoked_at < 5.0

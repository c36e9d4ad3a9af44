"""Every error the API returns is JSON in the OpenAI shape, with DEBUG on (Django's debug
pages are the worst case), and a refused request stores nothing. Through a live process."""

import json
import uuid

import httpx
import pytest
from django.conf import settings

from scheduler.models import Request
from tests import factories

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def live(served, transactional_db):
    srv = factories.server("sim", slots=2)
    factories.deployment(srv, "chat-model")
    factories.model("embed-model", type="embedding")
    factories.deployment(srv, "embed-model")
    return served(DEBUG="1")


def job(body: dict, kind: str = "chat") -> dict:
    return {"kind": kind, "body": body}


def deep(n: int) -> str:
    return "[" * n + "]" * n


def chat(**fields) -> dict:
    return {"model": "chat-model", "messages": HI, **fields}


# (method, path, body (dict or raw text), status, code)
CASES = [
    ("POST", "/api/v1/requests", job(chat(max_tokens="ten")), 400, "invalid_type"),
    ("POST", "/v1/chat/completions", chat(max_tokens="ten"), 400, "invalid_type"),
    ("POST", "/v1/chat/completions", chat(max_tokens=0), 400, "invalid_value"),
    ("POST", "/v1/chat/completions", chat(temperature="hot"), 400, "invalid_type"),
    ("POST", "/v1/chat/completions", chat(stream="yes"), 400, "invalid_type"),
    ("POST", "/v1/chat/completions", chat(prompt_cache_key=7), 400, "invalid_type"),
    ("POST", "/api/v1/requests", job(chat(messages=[{}])), 400, "invalid_value"),
    ("POST", "/v1/chat/completions", chat(messages=[{}]), 400, "invalid_value"),
    ("POST", "/v1/chat/completions", chat(messages=["hi"]), 400, "invalid_type"),
    ("POST", "/v1/chat/completions", chat(messages="hi"), 400, "invalid_type"),
    ("POST", "/api/v1/requests", {**job(chat()), "priorty": "background"}, 400, "invalid"),
    ("POST", "/v1/chat/completions", chat(messages=[]), 400, "missing"),
    ("POST", "/v1/chat/completions", chat(model=5), 400, "invalid_type"),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}]},
        400,
        "missing",
    ),
    ("POST", "/v1/chat/completions", chat(messages=[{"role": "user"}]), 400, "missing"),
    ("POST", "/v1/chat/completions", chat(model="embed-model"), 400, "model_type_mismatch"),
    (
        "POST",
        "/v1/completions",
        {"model": "embed-model", "prompt": "x"},
        400,
        "model_type_mismatch",
    ),
    ("POST", "/v1/embeddings", {"model": "chat-model", "input": "x"}, 400, "model_type_mismatch"),
    ("POST", "/v1/embeddings", {"model": "embed-model", "input": {"a": 1}}, 400, "invalid_type"),
    (
        "POST",
        "/api/v1/requests",
        job({"model": "chat-model", "input": "x"}, "embedding"),
        400,
        "model_type_mismatch",
    ),
    ("POST", "/api/v1/requests", deep(100_000), 400, "invalid_json"),
    ("POST", "/v1/chat/completions", deep(100_000), 400, "invalid_json"),
    ("POST", "/api/v1/requests", "[1, 2", 400, "invalid_json"),
    ("GET", "/api/v1/requests/not-a-uuid", None, 404, "not_found"),
    ("GET", f"/api/v1/requests/{uuid.uuid4()}/", None, 404, "not_found"),
    ("GET", "/api/v1/requests/", None, 404, "not_found"),
    ("GET", f"/api/v1/requests/{uuid.uuid4()}", None, 404, "request_not_found"),
    ("GET", "/v1/nothing-here", None, 404, "not_found"),
    ("POST", "/v1/models", None, 405, "method_not_allowed"),
    ("PUT", "/api/v1/requests", None, 405, "method_not_allowed"),
]


def send(live, method: str, path: str, body) -> httpx.Response:
    content = body if isinstance(body, str | None) else json.dumps(body)
    headers = {"Content-Type": "application/json"}
    return httpx.request(method, live.url + path, content=content, headers=headers, timeout=30)


def assert_openai_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.headers["Content-Type"].startswith("application/json"), r.text[:200]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (r.status_code, error["code"]) == (status, code), error


def test_bad_input_is_an_openai_error_and_stores_nothing(live):
    for method, path, body, status, code in CASES:
        r = send(live, method, path, body)
        try:
            assert_openai_error(r, status, code)
        except AssertionError as failed:
            raise AssertionError(f"{method} {path}: {failed}") from None
    assert Request.objects.count() == 0


def test_a_job_body_over_the_upload_limit_is_413(live):
    big = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    r = send(
        live, "POST", "/api/v1/requests", job(chat(messages=[{"role": "user", "content": big}]))
    )
    assert_openai_error(r, 413, "request_too_large")
    assert Request.objects.count() == 0


def test_a_job_sent_as_a_form_is_told_to_send_json(live):
    """curl -d sends `application/x-www-form-urlencoded` unless told otherwise."""
    r = httpx.post(
        live.url + "/api/v1/requests",
        content=json.dumps(job(chat())),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_openai_error(r, 415, "unsupported_media_type")
    assert "Content-Type: application/json" in r.json()["error"]["message"]
    assert Request.objects.count() == 0


def test_wait_s_must_be_a_finite_number(live):
    r = send(live, "POST", "/api/v1/requests", job(chat()))
    assert r.status_code == 202
    url = live.url + r.json()["url"]
    refused = [("nan", "invalid_value"), ("inf", "invalid_value"), ("-1", "invalid_value")]
    for value, code in [*refused, ("ten", "invalid_type")]:
        assert_openai_error(httpx.get(url, params={"wait_s": value}), 400, code)
    # Capped at 300 s; the request ends long before.
    assert httpx.get(url, params={"wait_s": "1e9"}, timeout=330).json()["state"] == "completed"


def test_json_nested_as_deep_as_the_parser_takes_is_stored(live):
    """The limit is the parser's: what parses is stored and served (PostgreSQL's jsonb too)."""
    body = json.dumps(job(chat(extra=json.loads(deep(500)))))
    r = send(live, "POST", "/api/v1/requests", body)
    assert r.status_code == 202, r.text
    assert httpx.get(live.url + r.json()["url"], params={"wait_s": "30"}).status_code == 200

"""Watch URLs: a signed link shows where a request is, never its prompt or its answer."""

import httpx
import pytest
from django.urls import reverse

from access.watch import token_for, watch_url
from scheduler.models import Request
from tests import factories
from tests.access.conftest import bearer

SECRET_PROMPT = "the-prompt-nobody-else-may-read"


def test_the_watch_url_is_the_pages_path(db):
    request_id = "0b5a1c7e-3a43-4c6b-9d2e-1f0a2b3c4d5e"
    assert watch_url(request_id) == reverse("watch", args=[token_for(request_id)])


def test_a_watch_page_shows_progress_without_prompt_or_answer(client, db):
    request = factories.request("qwen")
    Request.objects.filter(pk=request.pk).update(
        state="completed",
        payload={"model": "qwen", "messages": [{"role": "user", "content": SECRET_PROMPT}]},
        result={"choices": [{"message": {"content": "the-answer"}}]},
    )
    for path in [watch_url(request.pk), watch_url(request.pk) + ".json"]:
        r = client.get(path)
        assert r.status_code == 200
        text = r.content.decode()
        assert "completed" in text
        assert SECRET_PROMPT not in text and "the-answer" not in text
    data = client.get(watch_url(request.pk) + ".json").json()
    assert data["state"] == "completed" and "trace" in data and "answer" not in data


def test_a_forged_or_altered_token_finds_nothing(client, db):
    request = factories.request("qwen")
    token = token_for(request.pk)
    other = factories.request("qwen")
    for bad in [
        str(request.pk),
        token[:-1] + ("A" if token[-1] != "A" else "B"),
        f"{other.pk}:{token.split(':')[1]}",
    ]:
        assert client.get(f"/watch/{bad}").status_code == 404
        assert client.get(f"/watch/{bad}.json").status_code == 404


@pytest.mark.auth
def test_inference_and_jobs_answers_carry_the_watch_url(served, make_key):
    from tests.support.openai_upstream import Upstream

    up = Upstream(["m"])
    try:
        srv = factories.server("up", kind="openai", base_url=up.url, slots=2)
        factories.deployment(srv, "m", state="loaded")
        live = served(SWITCHYARD_AUTH="required")
        _, secret = make_key("alice")
        hi = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(f"{live.url}/v1/chat/completions", headers=bearer(secret), json=hi)
        assert r.headers["X-Switchyard-Watch-Url"] == watch_url(r.headers["X-Request-Id"])
        page = httpx.get(live.url + r.headers["X-Switchyard-Watch-Url"])  # no key, no login
        assert page.status_code == 200 and "completed" in page.text
        job = httpx.post(f"{live.url}/api/v1/requests", headers=bearer(secret), json={"body": hi})
        assert job.json()["watch_url"] == watch_url(job.json()["id"])
        assert job.headers["X-Switchyard-Watch-Url"] == job.json()["watch_url"]
    finally:
        up.close()

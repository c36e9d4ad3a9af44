"""Watch URLs: a signed link to the request's one (live) watch page: where it is and why,
its answer (issue 36: to the watcher who holds the URL), never its prompt."""

import httpx
import pytest
from django.urls import reverse

from access.watch import token_for, watch_url
from scheduler.models import Request
from tests import factories
from tests.access.conftest import bearer

SECRET_PROMPT = "the-prompt-nobody-else-may-read"


def test_the_watch_url_is_the_live_pages_path(db):
    request_id = "0b5a1c7e-3a43-4c6b-9d2e-1f0a2b3c4d5e"
    assert watch_url(request_id) == reverse("watch-live", args=[token_for(request_id)])


def test_the_first_links_lead_to_the_one_watch_page(client, db):
    """`/watch/<token>` (the links first handed out) redirects to the live page; the .json
    answers what that page shows: the answer, never the prompt."""
    request = factories.request("qwen")
    Request.objects.filter(pk=request.pk).update(
        state="completed",
        payload={"model": "qwen", "messages": [{"role": "user", "content": SECRET_PROMPT}]},
        result={"choices": [{"message": {"content": "the-answer"}}]},
    )
    token = token_for(request.pk)
    old = client.get(f"/watch/{token}")
    assert old.status_code == 302 and old["Location"] == watch_url(request.pk)
    page = client.get(old["Location"])
    assert page.status_code == 200 and SECRET_PROMPT not in page.content.decode()
    data = client.get(f"/watch/{token}.json").json()
    assert data["state"] == "completed" and "trace" in data
    assert data["answer"] == "the-answer" and SECRET_PROMPT not in str(data)


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

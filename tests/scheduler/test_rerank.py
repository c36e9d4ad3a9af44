"""`POST /v1/rerank` (and jobs of kind `rerank`) through a live Switchyard (`manage.py
serve`) in front of a simulated server: a reranking model's requests are scheduled as any
other, never streamed, and bad input is refused at the door. Against the real llama-server:
tests/integration/test_real_llama_single.py."""

import httpx
import pytest

from backends.models import ModelType
from scheduler.models import Request, RequestKind, State
from tests import factories

ONE = {"query": "q", "documents": ["a"]}
RERANK = {"query": "red apples", "documents": ["green pears", "red apples and plums", "apples"]}


@pytest.fixture
def live(served):
    sim = factories.server("sim")
    factories.model("ranker", type=ModelType.RERANKING)
    factories.deployment(sim, "ranker")
    factories.deployment(sim, "chatty")
    return served()


def test_rerank_answers_the_documents_best_first(live):
    answer = httpx.post(
        f"{live.url}/v1/rerank", json={"model": "ranker", "top_n": 2, **RERANK}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [r["index"] for r in body["results"]] == [1, 2]  # both words, then one
    assert body["results"][0]["relevance_score"] > body["results"][1]["relevance_score"]
    assert body["usage"]["prompt_tokens"] > 0
    request = Request.objects.get()
    assert (request.kind, request.state, request.stream) == (
        RequestKind.RERANK,
        State.COMPLETED,
        False,
    )


def test_a_rerank_is_never_streamed_and_can_be_a_job(live):
    streamed = httpx.post(
        f"{live.url}/v1/rerank", json={"model": "ranker", "stream": True, **RERANK}, timeout=30
    )
    assert streamed.headers["Content-Type"] == "application/json"
    assert len(streamed.json()["results"]) == 3
    job = httpx.post(
        f"{live.url}/api/v1/requests",
        json={"kind": "rerank", "body": {"model": "ranker", **RERANK}},
        timeout=30,
    ).json()
    done = httpx.get(f"{live.url}/api/v1/requests/{job['id']}", params={"wait_s": 30}).json()
    assert done["state"] == State.COMPLETED
    assert done["result"]["results"][0]["index"] == 1


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"model": "ranker", "documents": ["a"]}, "query", "missing"),
        ({"model": "ranker", "query": 3, "documents": ["a"]}, "query", "invalid_type"),
        ({"model": "ranker", "query": "q"}, "documents", "invalid_type"),
        ({"model": "ranker", "query": "q", "documents": []}, "documents", "invalid_type"),
        ({"model": "ranker", "query": "q", "documents": ["a", 2]}, "documents", "invalid_type"),
        ({"model": "ranker", **ONE, "top_n": 0}, "top_n", "invalid_value"),
        ({"model": "chatty", "query": "q", "documents": ["a"]}, "model", "model_type_mismatch"),
    ],
)
def test_bad_rerank_input_is_400_and_stores_nothing(live, body, param, code):
    answer = httpx.post(f"{live.url}/v1/rerank", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert not Request.objects.exists()


def test_a_reranking_model_serves_no_chat(live):
    answer = httpx.post(
        f"{live.url}/v1/chat/completions",
        json={"model": "ranker", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "model_type_mismatch"

"""A caller follows a streamed request on its watch page, on a phone-sized screen, without a
login: its place falls, the load bar shows, the reason changes, the answer appears as it is
written, and the end is plain."""

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from playwright.sync_api import expect

from dashboard.watch_tokens import token_for
from scheduler.models import Request
from tests import factories
from tests.dashboard.screens import screenshot, serious_accessibility_problems

pytestmark = pytest.mark.browser

LOAD_S = 3.0
TOKENS, TOKENS_PER_S = 16, 5  # each request runs about 3 s on the one slot
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def live(served):
    factories.deployment(
        factories.server("sim-1", kind="simulated", slots=1),
        "slow",
        load_s=LOAD_S,
        avg_load_s=LOAD_S,
        avg_inference_s=TOKENS / TOKENS_PER_S,
        load_options={"tokens_per_second": TOKENS_PER_S},
    )
    return served()


def chat(model: str, stream: bool) -> dict:
    messages = [{"role": "user", "content": "a question nobody else may read"}]
    return {"model": model, "messages": messages, "max_tokens": TOKENS, "stream": stream}


def streamed_request() -> Request:
    """The streamed request's row, once the API has stored it (a wait on the database)."""
    for _ in range(400):
        found = Request.objects.filter(stream=True).first()
        if found:
            return found
        threading.Event().wait(0.025)
    raise AssertionError("the streamed request was never stored")


def in_thread(fn):
    """The ORM from a thread of its own: Playwright's sync API runs an event loop here."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_a_caller_watches_a_streamed_request_on_a_phone(live, browser_page):
    first = httpx.post(
        f"{live.url}/api/v1/requests", json={"kind": "chat", "body": chat("slow", False)}
    )
    assert first.status_code == 202
    done = threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST", f"{live.url}/v1/chat/completions", json=chat("slow", True), timeout=60
        ) as r:
            for _ in r.iter_lines():
                pass
        done.set()

    threading.Thread(target=stream, daemon=True).start()
    streamed = in_thread(streamed_request)

    page = browser_page
    page.set_viewport_size(PHONE)
    page.goto(f"{live.url}/watch/{token_for(streamed.pk)}/")
    expect(page.locator("#live")).to_have_text("live")
    headline = page.locator("#watch-headline")
    expect(headline).to_have_text("Place 2 of 2")
    reason = page.locator("#watch-reason")
    expect(reason).to_contain_text("waiting for the load of slow on sim-1, ")
    # The simulated server reports its load's progress: the page says its figure.
    expect(reason).to_contain_text(re.compile(r"\d+% after \d+\.\d s, as the server reports"))
    expect(page.locator("#watch-load progress")).to_be_visible()
    expect(page.locator("#watch-eta")).to_contain_text("estimate")
    assert "a question nobody else may read" not in page.content()
    screenshot(page, "watch-waiting")
    assert serious_accessibility_problems(page) == []

    expect(headline).to_have_text("Place 1 of 1")
    expect(reason).to_have_text("next for a slot on sim-1")
    expect(headline).to_have_text("Being answered")
    # The answer appears as it is written, before the request ends.
    page.wait_for_function(
        "() => document.querySelector('#watch-headline').textContent === 'Being answered'"
        " && document.querySelector('#watch-answer').textContent.length > 0"
    )
    screenshot(page, "watch-streaming")
    expect(headline).to_have_text("Done")
    expect(page.locator("#watch-answer")).to_contain_text("This answer comes from a simulated")
    expect(page.locator("#watch-steps li").last).to_contain_text("completed")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "watch-done")
    assert done.wait(30)


@pytest.fixture
def late(served):
    """A model expected to answer in 0.1 s that takes about 8 s."""
    factories.deployment(
        factories.server("sim-1", kind="simulated", slots=1),
        "slow",
        load_s=0.5,
        avg_inference_s=0.1,
        load_options={"tokens_per_second": TOKENS_PER_S},
    )
    return served()


def test_a_page_opened_mid_answer_shows_it_from_its_start(late, browser_page):
    """The text written before the page opened is not on the row until the end: the page
    asks the caller's relay for it and shows the answer from its start while it is still
    being written; a run past its estimate ends "any moment", never "about 0.0 s left"."""
    live = late
    body = {**chat("slow", True), "max_tokens": 40}
    writing, done = threading.Event(), threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    writing.set()
        done.set()

    threading.Thread(target=stream, daemon=True).start()
    assert writing.wait(30)
    streamed = in_thread(streamed_request)

    page = browser_page
    page.goto(f"{live.url}/watch/{token_for(streamed.pk)}/")
    expect(page.locator("#watch-headline")).to_have_text("Being answered")
    expect(page.locator("#watch-now")).to_contain_text("should end any moment")
    answer, note = page.locator("#watch-answer"), page.locator("#watch-answer-note")
    expect(answer).to_have_text(re.compile(r"^This answer comes from a simulated"))
    expect(page.locator("#watch-headline")).to_have_text("Being answered")
    expect(note).to_be_hidden()
    expect(page.locator("#watch-headline")).to_have_text("Done", timeout=20_000)
    expect(answer).to_have_text(re.compile(r"^This answer comes from a simulated"))
    assert done.wait(30)


def test_pieces_of_an_answer_are_put_in_place_by_where_they_begin(live, browser_page):
    """The page's own merge, fed as its socket feeds it: a tail first (the page opened
    mid-answer) shows "…" and says so; the start it asked for goes before it, what both
    hold shown once; a piece it already has changes nothing."""
    waiting = in_thread(lambda: factories.request("slow"))
    page = browser_page
    page.goto(f"{live.url}/watch/{token_for(waiting.pk)}/")
    answer, note = page.locator("#watch-answer"), page.locator("#watch-answer-note")

    page.evaluate("SwitchyardWatch.chunk('a time', 10)")
    expect(answer).to_have_text("…a time")
    expect(note).to_contain_text("its start shows once it ends")
    page.evaluate("SwitchyardWatch.chunk(' there', 16)")
    page.evaluate("SwitchyardWatch.chunk('Once upon a ti', 0)")  # the start, overlapping
    expect(answer).to_have_text("Once upon a time there")
    expect(note).to_be_hidden()
    page.evaluate("SwitchyardWatch.chunk('a time', 10)")
    page.evaluate("SwitchyardWatch.chunk(' was', 22)")
    expect(answer).to_have_text("Once upon a time there was")

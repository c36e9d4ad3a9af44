"""A request whose model must load, followed in a real Chromium on the dashboard and on its
own page: its place falls, the load bar moves, the reason it waits changes, the answer
appears. The dashboard's screenshot for the docs is taken here, mid-load."""

import re
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from dashboard.history import floor_minute
from dashboard.models import MinuteStat
from scheduler.models import Priority
from tests import factories
from tests.dashboard.screens import add_spans, screenshot, serious_accessibility_problems
from tests.dashboard.test_browser import sign_in

pytestmark = pytest.mark.browser

LOAD_S = 3.0
TOKENS, TOKENS_PER_S = 12, 6  # each request runs 2 s on the one slot


def history() -> None:
    """An hour behind it, for charts worth a look in the screenshot."""
    now = timezone.now()
    minute = floor_minute(now)
    MinuteStat.objects.bulk_create(
        MinuteStat(
            minute=minute - timedelta(minutes=i),
            priority=p,
            finished=[9, 4, 6, 2][p] + (i * (p + 3)) % 5,
            wait_p50_s=[0.2, 0.8, 3.0, 20.0][p] * (1 + (i % 4) / 4),
            wait_p95_s=[2.0, 5.0, 30.0, 240.0][p] * (1 + (i % 6) / 6),
            waiting=[0, 1, 3, 12][p] + (i % 3) * p,
        )
        for i in range(1, 60)
        for p in Priority.values
    )
    add_spans(
        "gpu-box",
        now,
        [("qwen3-8b", 58, 22, 12), ("llama3.3-70b", 34, 15, 90), ("qwen3-8b", 18, 9, 12)],
    )


@pytest.fixture
def live(served):
    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    factories.deployment(
        factories.server("sim-1", kind="simulated", slots=1),
        "slow",
        load_s=LOAD_S,
        avg_load_s=LOAD_S,
        avg_inference_s=TOKENS / TOKENS_PER_S,
        load_options={"tokens_per_second": TOKENS_PER_S},
    )
    factories.server("gpu-box", kind="simulated", slots=2)
    history()
    return served()


def submit(url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}
    response = httpx.post(f"{url}/api/v1/requests", json={"kind": "chat", "body": body})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_request_is_followed_through_its_models_load(live, browser_page):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live.url)
    first, second = submit(live.url, "slow"), submit(live.url, "slow")
    row = page.locator(f'#waiting tr[data-request="{second}"]')
    expect(row.locator("td").first).to_have_text("2")
    # The policy's reason, as the worker stored it: the load, with the progress the
    # simulated server reports (the figure its bar shows too).
    expect(row.locator(".reason")).to_contain_text("waiting for the load of slow on sim-1, ")
    expect(row.locator(".reason")).to_contain_text(
        re.compile(r"\d+% after \d+\.\d s, as the server reports")
    )
    expect(row.locator(".eta")).to_contain_text("estimate")

    bar = page.locator('[data-server="sim-1"] .load progress')
    expect(bar).to_be_visible()
    page.wait_for_function(
        "() => { const b = document.querySelector('[data-server=\"sim-1\"] .load progress');"
        " return b && b.value >= 0.5; }"
    )  # the bar moves
    expect(page.locator(".charts")).to_have_attribute("data-loaded", "1h")
    screenshot(page, "dashboard-loading")

    # The load is done: the first is sent, the second is next, for a free slot.
    expect(row.locator("td").first).to_have_text("1")
    expect(row.locator(".reason")).to_have_text("next for a slot on sim-1")
    expect(page.locator(f'#running tr[data-request="{first}"]')).to_be_visible()

    page.goto(f"{live.url}/requests/{second}/")
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("#request-state")).to_have_text("completed")
    expect(page.locator("#answer")).to_contain_text("This answer comes from")
    expect(page.locator("#request-first-eta")).to_contain_text("off by")
    screenshot(page, "request")
    assert serious_accessibility_problems(page) == []

    page.goto(f"{live.url}/")
    expect(page.locator(f'#recent tr[data-request="{second}"] .pill')).to_have_text("completed")
    lane = page.locator('.lane[data-server="sim-1"] .span')
    expect(lane).to_have_count(1)  # the load just made, still there
    # Checked when sent; the figure comes with the history, re-read every 10 s.
    expect(page.locator("#eta-accuracy")).to_contain_text("of 2 requests", timeout=25_000)
    screenshot(page, "dashboard")

"""The dashboard's history in a real Chromium: charts drawn from the per-minute figures,
the load timeline, the per-class summary, the range choice; the admin and login pages in the
same look. Screenshots of each page go to test-artifacts/screenshots/."""

import re
from datetime import timedelta

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


@pytest.fixture
def with_history(served):
    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    gpu = factories.server("gpu-1", kind="simulated", slots=2)
    factories.deployment(gpu, "qwen3-8b")
    factories.server("gpu-2", kind="simulated")
    now = timezone.now()
    minute = floor_minute(now)
    stats = []
    for i in range(1, 50):
        for priority in Priority.values:
            stats.append(
                MinuteStat(
                    minute=minute - timedelta(minutes=i),
                    priority=priority,
                    finished=(i * (priority + 1)) % 13,
                    wait_p50_s=0.5 * (priority + 1),
                    wait_p95_s=2.0 * (priority + 1) + i % 5,
                    waiting=(i + priority) % 7,
                )
            )
    MinuteStat.objects.bulk_create(stats)
    add_spans(
        "gpu-2",
        now,
        [
            ("qwen3-8b", 45, 20, 40),
            ("nomic-embed", 30, None, 2),  # held beside the LLMs: a row of its own
            ("llama-70b", 25, 12, 40),
            ("qwen3-8b", 13, None, 40),
        ],
    )
    for _ in range(3):  # rows for the admin's lists
        factories.request(
            "qwen3-8b",
            state="failed",
            server=gpu,
            finished_at=now,
            error="the server answered 500: " + "a long upstream error message " * 4,
        )
    return served()


def test_charts_timeline_and_classes_render_with_data(with_history, browser_page):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, with_history.url)
    expect(page.locator("#user")).to_have_text("operator")
    expect(page.get_by_role("button", name="Log out")).to_be_visible()

    charts = page.locator(".charts")
    expect(charts).to_have_attribute("data-loaded", "1h")
    for name in ("finished", "waiting", "p50", "p95"):
        chart = page.locator(f"#chart-{name}")
        expect(chart.locator("canvas")).to_have_count(1)
        expect(chart).to_have_attribute("data-points", "60")
        expect(chart.locator(".u-legend")).to_contain_text("interactive")
    lane = page.locator('.lane[data-server="gpu-2"]')
    expect(lane.locator(".span")).to_have_count(4)
    expect(lane.locator(".span").first).to_have_attribute(
        "title", re.compile(r"qwen3-8b: on 20 min 0 s, loaded in 40\.0 s \(from \d{4}-")
    )
    # Models held at once are drawn on rows of their own: no bar hides another.
    boxes = [bar.bounding_box() for bar in lane.locator(".span").all()]
    embed = boxes.pop(1)
    assert all(embed["y"] >= b["y"] + b["height"] for b in boxes)
    assert len({b["y"] for b in boxes}) == 1  # one after the other, on one row
    expect(page.locator('.lane[data-server="gpu-1"] .span')).to_have_count(0)
    rows = page.locator("#classes tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.first).to_contain_text("interactive")
    expect(rows.first).to_contain_text("2 min 0 s")  # the class's max wait
    expect(page.locator("#eta-accuracy")).to_contain_text("ETA accuracy (last hour)")
    screenshot(page, "dashboard")
    assert serious_accessibility_problems(page) == []

    page.get_by_label("24 h").check()
    expect(charts).to_have_attribute("data-loaded", "24h")
    expect(page.locator("#chart-finished")).to_have_attribute("data-points", str(24 * 60))

    # The admin in the same time format, with the way back to the dashboard.
    page.goto(f"{with_history.url}/admin/backends/server/")
    expect(page.locator("#site-name")).to_have_text("Switchyard")
    expect(page.get_by_role("link", name="Dashboard")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    screenshot(page, "admin-servers")
    page.goto(f"{with_history.url}/admin/scheduler/request/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    screenshot(page, "admin-requests")


@pytest.fixture
def one_busy_minute(served):
    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    minute = floor_minute(timezone.now()) - timedelta(minutes=5)
    MinuteStat.objects.bulk_create(
        MinuteStat(minute=minute, priority=p, finished=3, wait_p50_s=4.0, wait_p95_s=9.0)
        for p in Priority.values
    )
    return served()


def test_a_minute_alone_with_waits_is_drawn_as_dots(one_busy_minute, browser_page):
    """Requests that finished in one minute only, after a quiet hour: their waits have no
    neighbour to draw a line to, so each class's is a dot (else the wait charts show
    nothing). The counts (finished, waiting) are 0 around it, so they draw lines."""
    page = browser_page
    sign_in(page, one_busy_minute.url)
    expect(page.locator(".charts")).to_have_attribute("data-loaded", "1h")
    for name in ("p50", "p95"):
        expect(page.locator(f"#chart-{name}")).to_have_attribute("data-dots", "4")
    expect(page.locator("#chart-finished")).to_have_attribute("data-dots", "0")


def test_a_load_bar_says_when_a_load_runs_past_its_estimate(with_history, browser_page):
    """An estimated bar (the server reports no fraction) stops short of full; past the
    estimate its label says so instead of "99%"."""
    page = browser_page
    sign_in(page, with_history.url)
    label = """([ago, expected]) => Switchyard.progress({
        started_at: new Date(Date.now() - ago * 1000).toISOString(),
        expected_s: expected, fraction: null, estimated: true,
    }).querySelector(".load-label").textContent"""
    assert re.fullmatch(r"loading \d\.\d s of ~10\.0 s · \d\d% ", page.evaluate(label, [5, 10]))
    assert re.fullmatch(
        r"loading 1[45]\.\d s, past the ~10\.0 s expected ", page.evaluate(label, [15, 10])
    )
    # Its victim still unloading (what others sent it may run on): it says so, not "past".
    first = """() => Switchyard.progress({
        started_at: new Date(Date.now() - 12000).toISOString(), expected_s: 4,
        fraction: null, estimated: true, unloading: "qwen3-8b",
    })"""
    text = page.evaluate(f"({first})().querySelector('.load-label').textContent")
    assert re.fullmatch(r"unloading qwen3-8b first, 1[123]\.\d s so far ", text), text
    assert page.evaluate(f"({first})().querySelector('progress').hasAttribute('value')") is False


def test_the_login_page_says_switchyard(with_history, browser_page):
    page = browser_page
    page.goto(f"{with_history.url}/admin/login/?next=/")
    expect(page).to_have_title(re.compile("Switchyard"))
    expect(page.locator("#site-name")).to_have_text("Switchyard")
    screenshot(page, "login")
    assert serious_accessibility_problems(page) == []


def test_a_disconnected_dashboard_greys_out_and_says_since_when(with_history, browser_page):
    page = browser_page
    sign_in(page, with_history.url)
    with_history.proc.terminate()  # the server goes away under the open page
    with_history.proc.wait(30)
    expect(page.locator("body")).to_have_class(re.compile("disconnected"))
    expect(page.locator("#live")).to_have_text(
        re.compile(r"^disconnected, reconnecting since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$")
    )
    assert page.evaluate("getComputedStyle(document.querySelector('main')).opacity") == "0.45"
    screenshot(page, "dashboard-disconnected")

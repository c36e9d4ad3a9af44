"""A real Chromium against a live Switchyard (`manage.py serve`): an operator signs in
through the admin, watches a model load on a simulated server and the request complete.
Playwright's `expect` waits for each state; nothing sleeps."""

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from backends.models import Server
from scheduler.models import Worker
from tests import factories

pytestmark = pytest.mark.browser

LOAD_S = 2.0
# Long enough to open the request's page while its model still loads, on a busy machine.
OTHER_LOAD_S = 3.0
OPERATOR_LOAD_S = 4.0


@pytest.fixture
def live(served):
    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    for server_name, model_name, load_s in (
        ("sim-1", "slow", LOAD_S),
        ("sim-2", "other", OTHER_LOAD_S),
    ):
        factories.deployment(
            factories.server(server_name, kind="simulated", slots=1),
            model_name,
            load_s=load_s,
            avg_load_s=load_s,
            load_options={"tokens_per_second": 50},
        )
    # Loaded by an operator's intent, long enough to see it on the card.
    factories.deployment(
        factories.server("sim-4", kind="simulated", slots=1), "big", load_s=OPERATOR_LOAD_S
    )
    # Kept loaded all day: the worker loads it by itself.
    factories.deployment(
        factories.server("sim-3", kind="simulated", slots=1),
        "kept",
        load_s=0.1,
        keep_loaded_hours="00:00-00:00",
    )
    # A real server's breaker is open: no probe before its cooldown ends, so it stays so.
    Server.objects.filter(pk=factories.server("gpu-box", kind="openai").pk).update(
        health="cooldown",
        cooldown_until=timezone.now() + timedelta(hours=1),
        last_error="3 failures in a row: connection refused",
    )
    return served()


def sign_in(page: Page, url: str) -> None:
    page.goto(f"{url}/admin/login/?next=/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-password")
    page.click("input[type=submit]")
    expect(page).to_have_url(f"{url}/")
    expect(page.locator("#live")).to_have_text("live")


def submit(url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = httpx.post(f"{url}/api/v1/requests", json={"kind": "chat", "body": body})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_an_operator_watches_loads_and_requests_complete(live, browser_page):
    page = browser_page
    sign_in(page, live.url)
    server = page.locator('[data-server="sim-1"]')
    expect(server.locator(".badge.simulated")).to_have_text("simulated")
    expect(server.locator(".status")).to_have_text("up")
    expect(page.locator("#waiting tr.empty")).to_have_text("Nobody is waiting.")
    broken = page.locator('[data-server="gpu-box"]')
    expect(broken.locator(".badge")).to_have_text("OpenAI-compatible (no load control)")
    expect(broken.locator(".status")).to_contain_text(re.compile(r"cooldown until .+ min .+ left"))
    expect(broken.locator(".error")).to_have_text("3 failures in a row: connection refused")

    kept = page.locator('[data-server="sim-3"] [data-model="kept"]')
    expect(kept.locator(".pill")).to_have_text("loaded")
    expect(kept.locator(".tag")).to_have_text("kept loaded")
    expect(kept.locator(".tag")).to_have_attribute("title", re.compile("00:00-00:00"))

    # The dashboard: a load under way, then its request done.
    request_id = submit(live.url, "slow")
    model = server.locator('[data-model="slow"]')
    expect(model.locator(".pill")).to_have_text("loading")
    expect(model.locator(".load progress")).to_be_visible()
    expect(model.locator(".load-label")).to_contain_text(f"of ~{LOAD_S:.1f} s")
    row = page.locator(f'#waiting tr[data-request="{request_id}"]')
    expect(row.locator(".pill")).to_have_text("needs loading")
    expect(row.locator("td").nth(4)).to_have_text("–")  # caller: no key with keys off
    expect(row.locator("a.request-link")).to_have_attribute("href", f"/requests/{request_id}/")

    done = page.locator(f'#recent tr[data-request="{request_id}"]')
    expect(done.locator(".pill")).to_have_text("completed")
    # Its wait (the load) and its run, apart, as the admin lists them.
    expect(done.locator("td").nth(7)).to_have_text(re.compile(r"^(\d+\.\d s|\d+ ms)$"))
    expect(done.locator("td").nth(8)).to_have_text(re.compile(r"^(\d+\.\d s|\d+ ms)$"))
    expect(model.locator(".pill")).to_have_text("loaded")
    expect(model.locator(".load")).to_have_count(0)
    expect(page.locator("#waiting tr.empty")).to_be_visible()

    done.locator("a.request-link").click()
    expect(page).to_have_url(re.compile(f"/requests/{request_id}/$"))
    expect(page.locator("#request-state")).to_have_text("completed")
    expect(page.locator("#request-server")).to_have_text("sim-1")
    expect(page.locator("#answer")).to_contain_text("This answer comes from")
    expect(page.locator("#request-took")).to_have_text(re.compile(r"^(\d+\.\d s|\d+ ms)$"))
    # loading, why it waits (the load), ready, sent, done
    expect(page.locator("#trace tbody tr")).to_have_count(5)
    # Each step also as the time since it arrived, to the millisecond, and where it was.
    first, last = page.locator("#trace tbody tr").first, page.locator("#trace tbody tr").last
    expect(first.locator("td").nth(1)).to_have_text(re.compile(r"^\+0\.\d{3} s$"))
    expect(last.locator("td").nth(1)).to_have_text(re.compile(r"^\+\d+\.\d{3} s$"))
    expect(last.locator("td").nth(4)).to_have_text("sim-1")
    watch = page.locator("#request-watch-link a")
    expect(watch).to_have_attribute("href", re.compile(r"^/watch/.+/$"))

    # A request's own page, followed live through its model's load on the other server.
    request_id = submit(live.url, "other")
    page.goto(f"{live.url}/requests/{request_id}/")
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("#request-state")).to_have_text("needs loading")
    expect(page.locator("#request-position")).to_have_text("1 of 1 waiting")
    expect(page.locator("#request-caller")).to_have_text("–")  # keys are off here
    expect(page.locator("#load progress")).to_be_visible()
    expect(page.locator("#request-state")).to_have_text("completed")
    expect(page.locator("#request-position")).to_have_text("–")
    expect(page.locator("#load")).to_be_empty()

    # An operator's load, on its server's card with its step while it runs, gone once done.
    page.goto(f"{live.url}/")
    expect(page.locator("#live")).to_have_text("live")
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    asked = page.request.post(
        f"{live.url}/api/v1/servers/sim-4/load",
        data={"model": "big"},
        headers={"X-CSRFToken": csrf},
    )
    assert asked.status == 202, asked.text()
    card = page.locator('[data-server="sim-4"]')
    intent = card.locator(f'[data-intent="{asked.json()["id"]}"]')
    expect(intent).to_have_text(re.compile(r"^operator load big: load started$"))
    expect(intent.locator(".tag")).to_have_attribute("title", "asked by user operator")
    expect(intent).to_have_count(0, timeout=OPERATOR_LOAD_S * 1000 + 30_000)
    expect(card.locator('[data-model="big"] .pill')).to_have_text("loaded")


@pytest.fixture
def no_worker(transactional_db):
    """A web process, and no worker anywhere."""
    from tests.scheduler.test_health import web_only

    User.objects.create_superuser("operator", "op@example.com", "a-long-password")
    web = web_only()
    yield web
    web.stop()


def in_thread(fn):
    """The ORM from a thread of its own: Playwright's sync API runs an event loop here."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_the_dashboard_says_when_nothing_schedules(no_worker, browser_page):
    """No live worker: requests are taken and nothing runs them, which every wait below
    would otherwise leave unexplained. A worker whose passes fail: the same, for new work."""
    sign_in(browser_page, no_worker.url)
    alert = browser_page.locator("#workers-alert")
    expect(alert).to_contain_text("No worker is running")
    expect(alert).to_contain_text("python manage.py run_scheduler")

    failing = in_thread(
        lambda: Worker.objects.create(
            host="gpu-host", pid=1, failing_since=timezone.now(), failing_error="KeyError: None"
        )
    )
    browser_page.reload()
    expect(alert).to_contain_text(f"Worker {failing.pk} on gpu-host cannot plan")
    expect(alert).to_contain_text("KeyError: None")
    expect(alert).not_to_contain_text("No worker is running")

    in_thread(lambda: Worker.objects.filter(pk=failing.pk).update(failing_since=None))
    browser_page.reload()  # within half a second: the socket pushes nothing older
    expect(alert).to_be_hidden()


def test_a_running_clock_never_counts_below_zero(no_worker, browser_page):
    """A request stamped by a clock ahead of the web process's (a worker on another
    machine) shows 0.0 s running, not "-30.0 s"."""

    def processing_from_the_future() -> None:
        d = factories.deployment(factories.server("sim-1"), "m", state="loaded", in_flight=1)
        ahead = timezone.now() + timedelta(seconds=30)
        factories.request("m", state="processing", server=d.server, deployment=d, started_at=ahead)

    in_thread(processing_from_the_future)
    sign_in(browser_page, no_worker.url)
    running_for = browser_page.locator("#running tbody tr td").nth(5)
    expect(running_for).to_have_text("0.0 s")

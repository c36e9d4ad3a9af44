import pytest
from django.core.cache import cache
from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(autouse=True)
def fresh_cache():
    """The dashboard caches its figures a few seconds per process: not across tests."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def browser_page():
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        # Every file a page asks for is there (its icon, which the browser fetches apart,
        # is checked in test_views.py).
        missing: list[str] = []
        page.on("response", lambda r: r.status >= 400 and missing.append(f"{r.status} {r.url}"))
        yield page
        browser.close()
    assert errors == [], "the page's JavaScript failed"
    assert missing == [], "the page asked for what the server does not have"

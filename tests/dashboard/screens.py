"""Where browser tests write their screenshots (a gitignored folder of test artifacts)."""

from pathlib import Path

from playwright.sync_api import Page

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path

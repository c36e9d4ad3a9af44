"""Where browser tests write their screenshots (a gitignored folder of test artifacts)."""

from datetime import datetime, timedelta
from pathlib import Path

from playwright.sync_api import Page

from dashboard.models import LoadSpan

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def add_spans(server: str, now: datetime, spans: list[tuple[str, int, int | None, float]]) -> None:
    """Stays of models on `server`: (model, minutes ago it began, minutes it stayed or None
    while still there, seconds its load took)."""
    for i, (model, start, stay, load_s) in enumerate(spans):
        began = now - timedelta(minutes=start)
        LoadSpan.objects.create(
            deployment_id=1000 + i,
            server=server,
            model=model,
            started_at=began,
            loaded_at=began + timedelta(seconds=load_s),
            ended_at=began + timedelta(minutes=stay) if stay else None,
        )


def serious_accessibility_problems(page: Page) -> list[str]:
    """What axe-core (the engine browsers' audits use) finds serious or critical on the
    page as it stands: missing labels and names, contrast, heading order, landmarks..."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]

"""The docs say only what exists: every file and folder they name, every link and anchor, and
every Switchyard path in the README and the API page. The README stays a newcomer's page."""

import re
import uuid
from pathlib import Path

import pytest
from django.urls import Resolver404, resolve

from dashboard.routing import websocket_urlpatterns
from scheduler.api import ollama_api
from scheduler.api.openai_asgi import KINDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "scheduler/README.md"]
# Docs whose paths are all Switchyard's own (operating.md also names the servers' APIs).
OWN_PATHS = [ROOT / "README.md", ROOT / "docs" / "api.md"]
# Made by a run, not kept in the repository.
GENERATED = ("bench-results/", "logs/", ".secret_key", "db.sqlite3")

CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"^\.?[A-Za-z_][\w.-]*(/[\w.-]+)*/?$")
PREFIXES = {"/v1", "/v1/", "/api/v1/"}  # named as such: "every answer under /v1/"
FILE = re.compile(r"\.(py|md|ya?ml|toml|json|txt|sh|html|js|css)$")
ROUTE = re.compile(
    r"(?:^|[\s`]|https?://[\w.:\[\]-]+)(/(?:v1|api|admin|dashboard|requests|metrics|ws)[^\s`'\")]*)"
)


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", doc.read_text(), re.M)}


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("doc", DOCS, ids=ids(DOCS))
def test_every_file_a_doc_names_exists(doc: Path) -> None:
    missing = []
    for name in CODE.findall(doc.read_text()):
        if "/" not in name or not REPO_PATH.match(name) or name.startswith(GENERATED):
            continue
        if not ((ROOT / name.split("/")[0]).exists() or FILE.search(name)):
            continue  # not a path of ours: `text/event-stream`, `LISTEN/NOTIFY`
        if not (ROOT / name).exists():
            missing.append(name)
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=ids(DOCS))
def test_every_link_and_anchor_leads_somewhere(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{doc.name} has broken links: {broken}"


def served(path: str) -> bool:
    """Whether Switchyard serves `path`, its placeholders (`{id}`) read as a request's UUID
    or as a number (an intent's id)."""
    return any(
        served_as(re.sub(r"<[^>]+>|\{[^}]+\}", value, path.split("?")[0]))
        for value in (str(uuid.uuid4()), "7")
    )


def served_as(path: str) -> bool:
    if path in KINDS or path in ollama_api.PATHS:
        return True
    if path.startswith("/ws/"):
        return any(p.pattern.match(path.removeprefix("/")) for p in websocket_urlpatterns)
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


@pytest.mark.parametrize("doc", OWN_PATHS, ids=ids(OWN_PATHS))
def test_every_switchyard_path_a_doc_names_is_served(doc: Path) -> None:
    routes = {r.rstrip(".,;:") for r in ROUTE.findall(doc.read_text())}
    routes = {r[:-1] if r.endswith(">") and "<" not in r else r for r in routes}  # <http://…>
    assert routes, "no paths found: the pattern is wrong"
    unknown = sorted(r for r in routes if r not in PREFIXES and not served(r))
    assert not unknown, f"{doc.name} names paths Switchyard does not serve: {unknown}"

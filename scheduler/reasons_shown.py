"""A stored wait reason (`scheduler/reasons.py`) as the API and the pages show it."""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from backends.models import Deployment, DeploymentState

from .models import WAITING_STATES, Request
from .reasons import BEHIND, WAITING, live_text


def shown(
    stored: Mapping[str, Any] | None,
    state: str,
    now: datetime,
    ahead: int | None = None,
    reported: float | None = None,
) -> dict | None:
    """A request's stored reason as shown while it waits (its text as of `now`, with a load
    at the fraction its server `reported`, if it did); without one (a deep line's tail, not
    yet seen by a pass), `behind N requests` if `ahead` (the requests before it in line) is
    known, `waiting to be placed` if none is; None once it no longer waits."""
    if state not in WAITING_STATES:
        return None
    if not stored:
        if ahead is None:
            return None
        if ahead == 0:  # first in line, before any pass has seen it (or none runs)
            return {"kind": WAITING, "text": "waiting to be placed", "details": {}}
        noun = "request" if ahead == 1 else "requests"
        return {
            "kind": BEHIND,
            "text": f"behind {ahead} {noun} in line",
            "details": {"ahead": ahead},
        }
    details = stored.get("details") or {}
    kind, text = stored.get("kind", WAITING), stored.get("text", "")
    text = live_text(kind, text, details, now, reported)
    return {"kind": kind, "text": text, "details": details}


def reported_fraction(r: Request) -> float | None:
    """How far the load `r` waits for has come, by its server's own figure; None when the
    server gives none (the reason then counts the time against the estimate). Every place
    that shows the reason passes it, so the API, the stream and the pages say the same."""
    if r.state not in WAITING_STATES or r.deployment_id is None:
        return None
    return server_fraction(r.deployment)


def server_fraction(d: Deployment) -> float | None:
    """A load under way's progress as its server reports it (the adapter stores it); None
    when it reports none, or nothing loads."""
    if d.state != DeploymentState.LOADING or d.load_started_at is None or not d.load_progress:
        return None
    return min(d.load_progress, 1.0)

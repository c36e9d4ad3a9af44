"""Prompt-cache affinity, at the door: which conversation a request continues, and the server
that ran its last turn. The policy prefers that server while it has a free slot, since its
prompt cache may still hold the conversation (`policy._Pass.least_busy`).

A conversation is named by the caller's `prompt_cache_key` (OpenAI's field for this), else
by its model and its start: the messages up to and including the first user message, with
the system prompt or instructions given beside them. A turn holding more than that start
continues a conversation, and only such a turn looks for its last one (one indexed read)."""

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from ..models import Request, RequestKind

TURNS = {
    RequestKind.CHAT: "messages",
    RequestKind.MESSAGE: "messages",
    RequestKind.RESPONSE: "input",
}
BESIDE = {RequestKind.MESSAGE: "system", RequestKind.RESPONSE: "instructions"}


def window_s() -> float:
    """How far back a conversation's last turn is looked for; 0 turns affinity off."""
    return settings.SWITCHYARD["CACHE_AFFINITY_S"]


def conversation(kind: str, body: dict[str, Any]) -> tuple[str, bool]:
    """The conversation's key ("" for none) and whether this turn may continue it."""
    named = body.get("prompt_cache_key")
    if isinstance(named, str) and named:
        return _digest(["named", body["model"], named]), True
    turns = body.get(TURNS.get(kind, ""))
    if not isinstance(turns, list):
        return "", False
    first = next(
        (i for i, t in enumerate(turns) if isinstance(t, dict) and t.get("role") == "user"), None
    )
    if first is None:
        return "", False
    start = turns[: first + 1]
    return _digest([body["model"], body.get(BESIDE.get(kind, "")), start]), len(turns) > first + 1


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def last_server(key: str) -> int | None:
    """The server of the conversation's latest turn that reached one, within the window
    (whatever became of it there: its prompt was read). By the index in its order, the
    first such entry: a key that thousands of requests share costs what a new one does (a
    filter on their state had PostgreSQL read and sort every one: 8 ms for 9,000)."""
    since = timezone.now() - timedelta(seconds=window_s())
    return (
        Request.objects.filter(affinity_key=key, created_at__gte=since, server__isnull=False)
        .exclude(affinity_key="")  # lets PostgreSQL use the partial index
        .order_by("-created_at")
        .values_list("server_id", flat=True)
        .first()
    )


def of(kind: str, body: dict[str, Any]) -> tuple[str, int | None]:
    """A new request's conversation key and the server its last turn ran on, if known."""
    if window_s() <= 0:
        return "", None
    key, continues = conversation(kind, body)
    return key, (last_server(key) if continues else None)

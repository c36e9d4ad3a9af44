"""Hints after commit: the channel layer tells web views and dashboards what moved.

The database is the truth; a listener that missed a hint re-reads it.
"""

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"


def request_group(request_id) -> str:
    return f"request-{request_id.hex if hasattr(request_id, 'hex') else request_id}"


async def send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(group, message)
    except Exception:  # a hint that cannot be sent must never break a transition
        log.exception("could not send %s to %s", message.get("type"), group)


def send_from_sync(group: str, message: dict[str, Any]) -> None:
    async_to_sync(send)(group, message)


def request_moved(request_id, state: str) -> None:
    """Called on commit of a request's transition (from a sync thread)."""
    message = {"type": "request.moved", "id": str(request_id), "state": state}
    send_from_sync(request_group(request_id), message)
    send_from_sync(DASHBOARD_GROUP, {"type": "dashboard.changed"})


def dashboard_changed() -> None:
    send_from_sync(DASHBOARD_GROUP, {"type": "dashboard.changed"})

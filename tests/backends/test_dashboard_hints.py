"""An operator's change to servers, models or deployments (the admin, a configuration file,
the operator API) tells the open dashboards, as the worker's changes do: a pruned server's
card stayed on every dashboard until something else changed."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from backends import config_file
from scheduler import wakeup
from scheduler.channel_hints import DASHBOARD_CHANGED, DASHBOARD_GROUP
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


async def told(change) -> dict:
    """What a channel in the dashboards' group (as an open dashboard's consumer is) hears
    first after `change` (run in a thread, as the admin's and the command's writes are)."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(DASHBOARD_GROUP, channel)
    try:
        await sync_to_async(change)()
        async with asyncio.timeout(10):
            return await layer.receive(channel)
    finally:
        await layer.group_discard(DASHBOARD_GROUP, channel)


async def test_a_pruned_server_is_told_to_the_dashboards():
    await sync_to_async(lambda: factories.deployment(factories.server("old-box"), "m"))()
    assert await told(lambda: config_file.apply({"servers": []}, prune=True)) == DASHBOARD_CHANGED


async def test_an_edit_in_the_admin_is_told_too():
    server = await sync_to_async(factories.server)("box")

    def edit() -> None:
        server.slots = 2
        server.save()

    assert await told(edit) == DASHBOARD_CHANGED


async def test_an_edit_of_a_server_or_a_deployment_wakes_the_workers():
    """Planned with at once: a deployment enabled in the admin while requests wait for its
    model waited for the next poll (5 s)."""
    server = await sync_to_async(factories.server)("box")
    deployment = await sync_to_async(factories.deployment)(server, "m")
    heard = asyncio.Event()

    def listener(arrived: object) -> None:
        heard.set()

    wakeup.subscribe(listener)
    try:
        for row in (server, deployment):
            heard.clear()
            row.enabled = False
            await sync_to_async(row.save)()
            async with asyncio.timeout(10):
                await heard.wait()
    finally:
        wakeup.unsubscribe(listener)

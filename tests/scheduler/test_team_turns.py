"""The keys of a team held to one request at a time take turns, run by the real runtime:
each turn is decided in a pass after the team's last request ended, and goes to the key
served longest ago (before, to the key just served, so one key's whole line ran first)."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from access.models import ApiKey, Team
from scheduler.models import Request
from scheduler.runtime import Runtime
from tests import factories
from tests.support.running import db_thread_closed  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_thread_closed")]


def team_lines() -> tuple[ApiKey, ApiKey]:
    factories.deployment(factories.server("sim", slots=2), "m", state="loaded")
    team = Team.objects.create(name="research", max_processing=1)
    a, _ = ApiKey.generate("a")
    b, _ = ApiKey.generate("b")
    for key in (a, b):
        key.team = team
        key.save()
    for key in (a, a, a, b, a, b, b, b):  # a's line first and longer
        factories.request("m", api_key=key)
    return a, b


def served_order() -> list[str]:
    done = Request.objects.order_by("started_at").values_list("api_key__name", flat=True)
    return list(done)


async def test_a_teams_keys_take_turns():
    await sync_to_async(team_lines)()
    await Runtime().run(asyncio.Event(), until_idle=True)
    order = await sync_to_async(served_order)()
    assert order[:6] == ["a", "b", "a", "b", "a", "b"], order

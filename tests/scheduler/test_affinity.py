"""Prompt-cache affinity at the door and in the worker: a conversation's key, the server
its last turn ran on, and a next turn sent back there through the real runtime and two real
HTTP servers (the policy's rule itself: test_policy_affinity.py)."""

import asyncio
import threading
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from backends.models import DeploymentState
from scheduler import wakeup
from scheduler.api import affinity, intake
from scheduler.decisions import SendOnArrival
from scheduler.models import Priority, Request, State
from scheduler.runtime import Runtime
from tests import factories
from tests.support.openai_upstream import Upstream
from tests.support.running import Running, all_ended, db_thread_closed  # noqa: F401 (fixture)

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = [SYSTEM, {"role": "user", "content": "Name a colour."}]
SECOND = [*FIRST, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "And?"}]


def chat(messages: list, **extra) -> dict:
    return {"model": "m1", "messages": messages, **extra}


# -- the conversation's key (pure) ----------------------------------------------------------


def test_a_next_turn_has_its_first_turn_s_key_and_continues_it():
    first, continues_first = affinity.conversation("chat", chat(FIRST))
    second, continues_second = affinity.conversation("chat", chat(SECOND))
    assert first == second and len(first) == 32
    assert (continues_first, continues_second) == (False, True)


@pytest.mark.parametrize(
    "other",
    [
        chat([SYSTEM, {"role": "user", "content": "Name a fruit."}]),  # another start
        chat([{"role": "user", "content": "Name a colour."}]),  # no system prompt
        {**chat(FIRST), "model": "m2"},  # another model
    ],
)
def test_another_start_or_model_is_another_conversation(other):
    assert affinity.conversation("chat", other)[0] != affinity.conversation("chat", chat(FIRST))[0]


def test_anthropic_s_system_and_the_responses_api_s_instructions_are_part_of_the_start():
    body = {"model": "m1", "messages": FIRST[1:]}
    plain = affinity.conversation("message", body)[0]
    assert affinity.conversation("message", {**body, "system": "Be terse."})[0] != plain
    items = {"model": "m1", "input": FIRST[1:]}
    plain = affinity.conversation("response", items)[0]
    assert affinity.conversation("response", {**items, "instructions": "Be terse."})[0] != plain


def test_prompt_cache_key_names_the_conversation_itself():
    """The caller's own key: every request that carries it may continue it, whatever its
    messages (a completion too)."""
    named = affinity.conversation("chat", chat(FIRST, prompt_cache_key="session-7"))
    assert named == affinity.conversation("completion", chat(SECOND, prompt_cache_key="session-7"))
    assert named[1] is True and named[0] != affinity.conversation("chat", chat(FIRST))[0]


@pytest.mark.parametrize(
    "kind, body",
    [
        ("completion", {"model": "m1", "prompt": "Once upon"}),
        ("response", {"model": "m1", "input": "Name a colour."}),
        ("chat", chat([SYSTEM])),  # no user message yet
        ("embedding", {"model": "m1", "input": "x"}),
    ],
)
def test_no_conversation_without_turns_or_a_named_key(kind, body):
    assert affinity.conversation(kind, body) == ("", False)


# -- stored at the door ---------------------------------------------------------------------


@pytest.fixture
def two_servers(db):
    servers = [factories.server(name) for name in ("a", "b")]
    for srv in servers:
        factories.deployment(srv, "m1", state=DeploymentState.LOADED)
    return servers


def turn_ran_on(srv, messages: list, state: str = State.COMPLETED, age_s: float = 0) -> None:
    """A stored turn, as a request that ran on `srv` (None: one that reached no server)."""
    key, _ = affinity.conversation("chat", chat(messages))
    created = timezone.now() - timedelta(seconds=age_s)
    factories.request("m1", state=state, server=srv, affinity_key=key, created_at=created)


@pytest.mark.parametrize("latest", [State.COMPLETED, State.PROCESSING, State.FAILED])
def test_a_next_turn_is_stored_with_the_server_of_its_last_turn(two_servers, latest):
    """The latest turn that reached a server, whatever became of it there."""
    a, b = two_servers
    turn_ran_on(a, FIRST, age_s=60)
    turn_ran_on(b, FIRST, state=latest, age_s=30)
    turn_ran_on(None, FIRST, state=State.EXPIRED)  # never sent: no cache anywhere
    stored = intake.accept("chat", chat(SECOND))
    assert stored.affinity_key == affinity.conversation("chat", chat(FIRST))[0]
    assert Request.objects.get(pk=stored.pk).cache_server_id == b.pk


def test_a_first_turn_is_stored_with_its_key_and_no_server(two_servers):
    turn_ran_on(two_servers[1], FIRST)  # the same start, asked again: not a next turn
    stored = Request.objects.get(pk=intake.accept("chat", chat(FIRST)).pk)
    assert stored.affinity_key and stored.cache_server_id is None


def test_a_turn_older_than_the_window_names_no_server(two_servers):
    turn_ran_on(two_servers[1], FIRST, age_s=affinity.window_s() + 60)
    assert intake.accept("chat", chat(SECOND)).cache_server_id is None


def test_a_window_of_zero_turns_affinity_off(two_servers, knobs):
    knobs(CACHE_AFFINITY_S=0)
    turn_ran_on(two_servers[1], FIRST)
    stored = intake.accept("chat", chat(SECOND, prompt_cache_key="k"))
    assert (stored.affinity_key, stored.cache_server_id) == ("", None)


# -- through the worker ---------------------------------------------------------------------

db = sync_to_async


@pytest.mark.parametrize("window_s, next_turn_to", [(1800.0, "b"), (0.0, "a")])
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_thread_closed")
async def test_the_next_turn_goes_back_to_the_server_of_the_last(knobs, window_s, next_turn_to):
    """The first turn runs on b, since a is busy. Once both are idle, the second turn goes
    back to b, by a pass rather than on arrival (that fast path planned a, which sorts
    first). With affinity off, it goes to a. Breaks if the next turn were routed by load
    alone, or sent on arrival where the plan said."""
    knobs(CACHE_AFFINITY_S=window_s)
    upstreams = {"a": Upstream(["m1"]), "b": Upstream(["m1"])}
    upstreams["a"].gate = threading.Event()

    def setup() -> None:
        for name, upstream in upstreams.items():
            srv = factories.server(name, kind="openai", base_url=upstream.url)
            factories.deployment(srv, "m1", state=DeploymentState.LOADED)

    def ran_on(request: Request) -> str:
        return Request.objects.select_related("server").get(pk=request.pk).server.name

    try:
        await db(setup)()
        async with Running() as running:
            busy = await db(intake.accept)("chat", chat([{"role": "user", "content": "x"}]))
            assert await asyncio.to_thread(upstreams["a"].arrived.wait, 10)
            first = await db(intake.accept)("chat", chat(FIRST))
            await running.until(lambda: Request.objects.get(pk=first.pk).state == "completed")
            upstreams["a"].gate.set()
            await running.until(all_ended)
            await running.passes(1)  # a plan made with both idle: the next arrival to a
            second = await db(intake.accept)("chat", chat(SECOND))
            await running.until(all_ended, wake=False)  # its own wake-up only
        assert [await db(ran_on)(r) for r in (busy, first, second)] == ["a", "b", next_turn_to]
        traced = await db(lambda: Request.objects.get(pk=second.pk).traces.first().reason)()
        assert ("where its conversation's last turn ran (b)" in traced) == (next_turn_to == "b")
        assert len(upstreams["b"].received) == (2 if next_turn_to == "b" else 1)
    finally:
        for upstream in upstreams.values():
            upstream.gate = None
            upstream.close()


def test_an_arrival_whose_conversation_ran_elsewhere_is_left_to_a_pass():
    """The last pass planned the next m1 arrival for server 2; one whose last turn ran on
    server 1 is not sent there on arrival (server 1 may have a free slot: a pass weighs
    it), and the planned room stays for the next arrival."""
    rt = Runtime()
    rt.fast.install([SendOnArrival("m1", 2, 2, 1)], 0, {2: 1})
    rt.idle = True
    rt.news(wakeup.Arrival(Priority.NORMAL, uuid.uuid4(), "m1", cache_server=1))
    assert rt.fast.arrivals == [(Priority.NORMAL, 0)] and not rt.effects.tasks
    assert rt.fast.room == {2: 1}

"""The dashboard's state, read from database rows at a fixed `now`."""

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from access.models import ApiKey, Team
from backends.models import Deployment, DeploymentState, Server
from dashboard import state
from scheduler.models import Intent, Priority, Request, State, Trace, Worker
from tests import factories
from tests.support.table_reads import entries_read_by

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def ago(seconds: float):
    return NOW - timedelta(seconds=seconds)


def server_named(overview: dict, name: str) -> dict:
    return next(s for s in overview["servers"] if s["name"] == name)


def started_loading(srv: Server, model_name: str, seconds_ago: float, **fields: Any) -> Deployment:
    """A deployment that started loading `seconds_ago` seconds before NOW."""
    return factories.deployment(
        srv, model_name, state=DeploymentState.LOADING, load_started_at=ago(seconds_ago), **fields
    )


def test_simulated_servers_are_marked_and_real_ones_are_not():
    factories.server("sim", kind="simulated")
    factories.server("box", kind="openai", base_url="http://127.0.0.1:9")
    view = state.overview(NOW)
    assert server_named(view, "sim")["simulated"] is True
    assert server_named(view, "box")["simulated"] is False
    assert server_named(view, "box")["kind_label"] == "OpenAI-compatible (no load control)"


def test_down_cooldown_and_disabled_servers_say_so():
    factories.server("up-1")
    down = factories.server("down-1")
    down.health, down.last_error = "down", "connection refused"
    down.save()
    cool = factories.server("cool-1")
    cool.health, cool.cooldown_until, cool.last_error = "cooldown", NOW + timedelta(seconds=42), "x"
    cool.save()
    factories.server("off-1", enabled=False)
    view = state.overview(NOW)
    assert server_named(view, "up-1")["status"] == "up"
    assert server_named(view, "up-1")["last_error"] == ""
    assert server_named(view, "down-1")["status"] == "down"
    assert server_named(view, "down-1")["last_error"] == "connection refused"
    cooling = server_named(view, "cool-1")
    assert cooling["status"] == "cooldown"
    assert cooling["cooldown_until"] == (NOW + timedelta(seconds=42)).isoformat()
    assert cooling["cooldown_left_s"] == 42.0
    assert server_named(view, "off-1")["status"] == "disabled"


def test_a_cooldown_past_its_end_lasts_until_the_probe_answers():
    cool = factories.server("cool-1")
    cool.health, cool.cooldown_until = "cooldown", ago(5)
    cool.save()
    assert server_named(state.overview(NOW), "cool-1")["cooldown_left_s"] == 0.0


def test_loaded_and_loading_models_are_listed_unloaded_ones_are_not():
    srv = factories.server("sim", slots=4)
    factories.deployment(srv, "a", state=DeploymentState.LOADED, in_flight=3)
    started_loading(srv, "b", 1, load_progress=0.5)
    factories.deployment(srv, "c", state=DeploymentState.UNLOADED)
    view = server_named(state.overview(NOW), "sim")
    assert [(m["model"], m["state"]) for m in view["models"]] == [
        ("a", "loaded"),
        ("b", "loading"),
    ]
    assert (view["in_use"], view["slots"]) == (3, 4)


def test_a_restore_is_marked_until_a_request_uses_it():
    srv = factories.server("sim", slots=4)
    started_loading(srv, "b", 1, load_cause="restore")
    used = factories.deployment(srv, "a", state=DeploymentState.LOADED, load_cause="restore")
    used.loaded_at, used.last_used_at = ago(60), ago(5)
    used.save()
    view = server_named(state.overview(NOW), "sim")
    assert {m["model"]: m["restore"] for m in view["models"]} == {"a": False, "b": True}


def test_a_model_loaded_outside_switchyard_is_marked_while_loaded():
    srv = factories.server("box", slots=4)
    factories.deployment(srv, "a", state=DeploymentState.LOADED, load_cause="outside")
    factories.deployment(srv, "b", state=DeploymentState.LOADED, load_cause="request")
    factories.deployment(srv, "c", state=DeploymentState.UNLOADING, load_cause="outside")
    view = server_named(state.overview(NOW), "box")
    assert {m["model"]: m["outside"] for m in view["models"]} == {
        "a": True,
        "b": False,
        "c": False,
    }


def test_a_model_with_keep_loaded_hours_says_them():
    srv = factories.server("sim", slots=4)
    factories.deployment(
        srv, "chat", state=DeploymentState.LOADED, keep_loaded_hours="mon-fri 08:00-18:00"
    )
    [shown] = server_named(state.overview(NOW), "sim")["models"]
    assert shown["keep_loaded_hours"] == "mon-fri 08:00-18:00"


def test_a_model_with_slots_of_its_own_says_how_many_it_uses():
    """The page shows `1/2 in flight` for it."""
    srv = factories.server("sim", slots=4)
    factories.deployment(srv, "big", state=DeploymentState.LOADED, slots=2, in_flight=1)
    [shown] = server_named(state.overview(NOW), "sim")["models"]
    assert (shown["in_flight"], shown["slots"]) == (1, 2)


def test_an_operators_open_intents_are_shown_on_their_server_with_their_latest_step():
    """What an operator asked of a server, and what it waits for; finished ones are gone."""
    srv = factories.server("gpu-1")
    factories.server("gpu-2")
    d = factories.deployment(srv, "a", state=DeploymentState.LOADED, in_flight=1)
    unload = Intent.objects.create(server=srv, action="unload", deployment=d, requested_by="ops")
    unload.traces.create(status="pending", reason="asked by user ops through the API")
    unload.traces.create(status="pending", reason="waiting for its requests to finish")
    drain = Intent.objects.create(server=srv, action="drain", requested_by="key bot (sy-1…)")
    drain.traces.create(status="pending", reason="waiting for the server's earlier intents")
    done = Intent.objects.create(server=srv, action="enable", status="done", requested_by="ops")
    done.traces.create(status="done", reason="enabled")

    view = state.overview(NOW)
    shown = [
        (i["action"], i["model"], i["status"], i["reason"], i["requested_by"])
        for i in server_named(view, "gpu-1")["intents"]
    ]
    assert shown == [
        ("unload", "a", "pending", "waiting for its requests to finish", "ops"),
        ("drain", None, "pending", "waiting for the server's earlier intents", "key bot (sy-1…)"),
    ]
    assert server_named(view, "gpu-2")["intents"] == []


def test_load_progress_is_the_adapters_own_figure_when_it_reports_one():
    srv = factories.server()
    d = started_loading(srv, "m", 3, load_progress=0.25, avg_load_s=10)
    assert state.load_progress(d, NOW) == {
        "started_at": ago(3).isoformat(),
        "elapsed_s": 3.0,
        "expected_s": 10.0,
        "fraction": 0.25,
        "estimated": False,
    }


def test_load_progress_is_estimated_from_the_moving_average_otherwise():
    srv = factories.server()
    d = started_loading(srv, "m", 4, load_progress=0.0)
    assert state.load_progress(d, NOW)["fraction"] is None  # never loaded: nothing to go by
    d.avg_load_s = 10
    progress = state.load_progress(d, NOW)
    assert (progress["fraction"], progress["estimated"]) == (0.4, True)
    # A load slower than usual stays short of full until the server says it is done.
    assert state.load_progress(d, NOW + timedelta(seconds=60))["fraction"] == 0.99


def test_a_load_that_first_unloads_its_victim_says_so_on_its_bars():
    """While `b` unloads for `a`'s load (its server may let what others sent it finish
    first), `a`'s bar names it and shows no fraction, on the server's card and on the watch
    page of a request waiting for `a`: its load has not begun."""
    srv = factories.server()
    a = started_loading(srv, "a", 12, avg_load_s=4)
    factories.deployment(srv, "b", state=DeploymentState.UNLOADING)
    r = factories.request("a", state=State.NEEDS_LOADING, server=srv, deployment=a)
    models = {m["model"]: m for m in server_named(state.overview(NOW), srv.name)["models"]}
    for bar in (models["a"]["progress"], state.request_detail(r.pk, NOW)["load"]):
        assert (bar["unloading"], bar["fraction"]) == ("b", None)
    assert models["b"]["progress"] is None


def test_a_first_load_is_estimated_from_the_same_model_on_another_server():
    factories.deployment(factories.server("other"), "m", avg_load_s=16.0)
    d = started_loading(factories.server(), "m", 4)
    progress = state.load_progress(d, NOW)
    assert (progress["expected_s"], progress["fraction"], progress["estimated"]) == (
        16.0,
        0.25,
        True,
    )


def test_waiting_rows_are_in_line_order_with_place_and_eta():
    srv = factories.server("sim", slots=1)
    loaded = factories.deployment(srv, "a", state=DeploymentState.LOADED, avg_inference_s=2.0)
    loading = started_loading(srv, "b", 4, avg_load_s=10.0, avg_inference_s=3.0)
    background = factories.request("a", Priority.BACKGROUND, created_at=ago(30))
    first = factories.request(
        "a", state=State.READY, server=srv, deployment=loaded, created_at=ago(20)
    )
    second = factories.request(
        "a", state=State.READY, server=srv, deployment=loaded, created_at=ago(10)
    )
    joined = factories.request(
        "b", Priority.INTERACTIVE, state=State.NEEDS_LOADING, server=srv, deployment=loading
    )
    research = Team.objects.create(name="research")
    alice, _ = ApiKey.generate("alice", team=research)
    alice.save()
    unrouted = factories.request("a", created_at=ago(5), api_key=alice)
    rows = state.overview(NOW)["waiting"]
    assert [r["id"] for r in rows] == [
        str(r.pk) for r in (joined, first, second, unrouted, background)
    ]
    assert [r["position"] for r in rows] == [1, 2, 3, 4, 5]
    # Seconds until each is sent: the loaded model's requests use the one slot while b
    # loads (6 s left), one run of 2 s each; then b's; then the background one.
    assert [r["eta_s"] for r in rows] == [6.0, 0.0, 2.0, 4.0, 9.0]
    assert rows[1]["server"] == "sim"
    assert rows[1]["waited_s"] == 20.0
    # Whose it is, for the staff: the key and its team (none with keys off).
    assert [r["caller"] for r in rows] == [None, None, None, "alice (research)", None]


def test_running_and_recently_finished_requests():
    srv = factories.server("sim")
    d = factories.deployment(srv, "a", state=DeploymentState.LOADED, avg_inference_s=5.0)
    bob, _ = ApiKey.generate("bob")
    bob.save()
    running = factories.request(
        "a", state=State.PROCESSING, server=srv, deployment=d, started_at=ago(2), api_key=bob
    )
    done = factories.request(
        "a",
        state=State.COMPLETED,
        server=srv,
        created_at=ago(9),
        started_at=ago(6),
        finished_at=ago(1),
        api_key=bob,
    )
    failed = factories.request(
        "a", state=State.FAILED, error="boom", created_at=ago(9), finished_at=ago(3)
    )
    view = state.overview(NOW)
    assert [(r["id"], r["eta_s"]) for r in view["running"]] == [(str(running.pk), 3.0)]
    assert view["running"][0]["caller"] == "bob"
    assert [(r["id"], r["state"]) for r in view["recent"]] == [
        (str(done.pk), "completed"),
        (str(failed.pk), "failed"),
    ]
    # Waited and ran, apart, as the admin lists them; the failed one never ran.
    assert [(r["waited_s"], r["took_s"]) for r in view["recent"]] == [(3.0, 5.0), (6.0, None)]
    assert view["recent"][1]["error"] == "boom"
    assert state.request_detail(done.pk, NOW)["took_s"] == 5.0  # its own page says it too
    assert [(r["priority"], r["caller"]) for r in view["recent"]] == [
        ("normal", "bob"),
        ("normal", None),
    ]


def test_the_overview_runs_the_same_few_queries_for_three_rows_or_a_hundred_and_twenty():
    def queries() -> int:
        cache.clear()  # the cached figures are read too
        with CaptureQueriesContext(connection) as ctx:
            view = state.overview(NOW)
        return len(ctx.captured_queries), len(view["waiting"])

    for i in range(3):
        srv = factories.server(f"s{i}", slots=2)
        for name in ("a", "b"):
            factories.deployment(srv, name, state=DeploymentState.LOADED)
    d = factories.deployment(factories.server("s9"), "a", state=DeploymentState.LOADED)

    team = Team.objects.create(name="t")

    def add(n: int) -> None:
        for i in range(n):
            key, _ = ApiKey.generate(f"k{i}", team=team)  # each row's caller: no query each
            key.save()
            factories.request("a", state=State.READY, server=d.server, deployment=d, api_key=key)
            factories.request("b", state=State.COMPLETED, finished_at=NOW, api_key=key)
            intent = Intent.objects.create(server=d.server, action="drain", requested_by="ops")
            intent.traces.create(status="pending", reason="waiting")  # each intent's step too

    add(3)
    few, shown = queries()
    assert shown == 3
    add(117)
    many, shown = queries()
    assert shown == state.WAITING_SHOWN
    assert many == few <= 15  # the ETA reads its callers' quotas once


def test_request_detail_has_place_eta_load_and_trace():
    srv = factories.server("sim", slots=1)
    d = started_loading(srv, "m", 1, load_progress=0.5, avg_load_s=4.0, avg_inference_s=1.0)
    factories.request("other", Priority.INTERACTIVE)
    ahead = factories.request(
        "m", state=State.NEEDS_LOADING, server=srv, deployment=d, created_at=ago(3)
    )
    key, _ = ApiKey.generate("alice")
    key.save()
    r = factories.request("m", state=State.NEEDS_LOADING, server=srv, deployment=d, api_key=key)
    Trace.objects.create(
        request=r,
        at=ago(1),
        from_state="pending",
        to_state="needs_loading",
        server="sim",
        reason="routed; loading m",
    )
    detail = state.request_detail(r.pk, NOW)
    assert (detail["position"], detail["waiting_total"]) == (3, 3)
    # Sent after the load (half done after 1 s, by its server: 1 s left, not the average's 3)
    # and the one ahead.
    assert detail["eta_s"] == 1.0 + 1.0
    assert detail["load"]["fraction"] == 0.5
    assert [(t["to"], t["reason"]) for t in detail["trace"]] == [
        ("needs_loading", "routed; loading m")
    ]
    assert state.request_detail(ahead.pk, NOW)["position"] == 2
    assert (detail["caller"], state.request_detail(ahead.pk, NOW)["caller"]) == ("alice", None)


@pytest.mark.skipif(not settings.IS_POSTGRES, reason="PostgreSQL's scans and statistics")
@pytest.mark.django_db(transaction=True)
def test_the_recently_finished_are_read_without_reading_every_finished_request():
    first = factories.request("m", state=State.COMPLETED, finished_at=NOW)
    table = Request._meta.db_table
    columns = [f.column for f in Request._meta.concrete_fields if f.column != "id"]
    earlier = {"created_at": "created_at - g * interval '1 s'", "finished_at": "%s"}
    with connection.cursor() as cursor:  # 50,000 requests finished before it
        cursor.execute(
            f"INSERT INTO {table} (id, {', '.join(columns)}) SELECT gen_random_uuid(), "
            + ", ".join(earlier.get(c, c) for c in columns)
            + f" FROM {table} r, generate_series(1, 50000) g WHERE r.id = %s",
            [ago(60), first.pk],
        )

    view, read = entries_read_by(lambda: state.overview(NOW))

    assert view["recent"][0]["id"] == str(first.pk)
    assert len(view["recent"]) == state.RECENT_SHOWN
    assert 0 < read < 1000  # not the 50,000


def test_a_held_request_is_forecast_past_its_hold_and_one_failing_soon_is_not():
    """Only the policy knows its holds: the forecast reads when one ends from the request's
    stored reason. A no-server reason's time is when it fails, not when it goes."""
    srv = factories.server("sim", slots=2)
    d = factories.deployment(srv, "m", state=DeploymentState.LOADED, avg_inference_s=1.0)
    until = (NOW + timedelta(seconds=30)).isoformat()
    held, failing = (
        factories.request(
            "m",
            state=State.READY,
            server=srv,
            deployment=d,
            reason={"kind": kind, "text": "…", "details": {"until": until}},
        )
        for kind in ("held", "no_server")
    )
    assert state.request_detail(held.pk, NOW)["eta_s"] == 30.0
    assert state.request_detail(failing.pk, NOW)["eta_s"] == 0.0


def test_a_finished_request_shows_its_answer_and_no_place():
    r = factories.request(
        "m",
        state=State.COMPLETED,
        finished_at=NOW,
        result={"choices": [{"message": {"role": "assistant", "content": "Hello"}}]},
    )
    detail = state.request_detail(r.pk, NOW)
    assert (detail["state"], detail["position"], detail["eta_s"]) == ("completed", None, None)
    assert detail["answer"] == "Hello"


def test_an_answer_that_calls_tools_shows_each_call_in_every_api_shape():
    """An agent's turn that only calls a tool has no text: the pages show the calls."""
    weather = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    chat = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [{"id": "c1", "type": "function", "function": weather}],
                }
            }
        ]
    }
    message = {
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}
        ],
    }
    response = {"object": "response", "output": [{"type": "function_call", **weather}]}
    shown = []
    for result in (chat, message, response):
        r = factories.request("m", state=State.COMPLETED, finished_at=NOW, result=result)
        shown.append(state.request_detail(r.pk, NOW)["answer"])
    assert shown == [
        'Checking.\n→ get_weather({"city": "Oslo"})',
        '→ get_weather({"city": "Oslo"})',
        '→ get_weather({"city": "Oslo"})',
    ]


def test_an_unknown_request_has_no_detail():
    assert state.request_detail("00000000-0000-0000-0000-000000000000") is None


def test_the_workers_say_whether_anything_schedules(settings):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "WORKER_STALE_S": 30}
    assert state.workers_state(NOW) == {"live": 0, "last_heartbeat": None, "failing": []}
    Worker.objects.create(host="a", pid=1, last_heartbeat=ago(5))
    gone = Worker.objects.create(host="b", pid=2, last_heartbeat=ago(60), failing_since=ago(90))
    failing = Worker.objects.create(
        host="c", pid=3, last_heartbeat=ago(1), failing_since=ago(20), failing_error="KeyError"
    )
    seen = state.workers_state(NOW)
    assert seen["live"] == 2 and seen["last_heartbeat"] == ago(1).isoformat()
    assert seen["failing"] == [
        {"id": failing.pk, "host": "c", "since": ago(20).isoformat(), "error": "KeyError"}
    ]
    assert gone.pk not in [f["id"] for f in seen["failing"]]  # a dead one: not "live"

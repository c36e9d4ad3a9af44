"""The history task's writes, at fixed times: load spans followed from deployments' states,
minutes rolled up, ETAs stamped and checked; and the charts' read of them."""

import functools
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from access.models import ApiKey, Team
from backends.models import Deployment
from backends.models import DeploymentState as DS
from dashboard import charts, eta_checks, forecast, history, state
from dashboard.models import EtaCheck, LoadSpan, MinuteStat, RunStat
from scheduler.eta import DEFAULT_RUN_S
from scheduler.models import Priority, Request, State
from tests import factories

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(second=30, microsecond=0)


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def chat(**asked) -> dict:
    """A chat's payload, with the tokens it asks for at most (`max_tokens=…`) if any."""
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **asked}


def background_ran(started_at, ran_s: float, tokens: int | None = None, **fields) -> Request:
    """A background request of `m` that completed after running `ran_s` seconds, having
    generated `tokens` (as its server counted them) if given; no cap asked unless given."""
    usage = {"result": {"usage": {"completion_tokens": tokens}}} if tokens else {}
    return factories.request(
        "m",
        Priority.BACKGROUND,
        state=State.COMPLETED,
        started_at=started_at,
        finished_at=started_at + timedelta(seconds=ran_s),
        **{"payload": chat(), **usage, **fields},
    )


def test_a_models_stay_is_followed_from_load_to_unload():
    d = factories.deployment(factories.server("gpu-1"), "m", state=DS.UNLOADED)
    history.record_loads(at(0))
    assert not LoadSpan.objects.exists()

    d.state, d.load_started_at, d.state_changed_at = DS.LOADING, at(1), at(1)
    d.save()
    history.record_loads(at(2))
    history.record_loads(at(3))  # nothing new: the same span
    span = LoadSpan.objects.get()
    assert (span.server, span.model, span.started_at, span.loaded_at) == ("gpu-1", "m", at(1), None)

    d.state, d.loaded_at, d.state_changed_at = DS.LOADED, at(5), at(5)
    d.save()
    history.record_loads(at(6))
    span.refresh_from_db()
    assert (span.loaded_at, span.ended_at) == (at(5), None)

    d.state, d.loaded_at, d.state_changed_at = DS.UNLOADED, None, at(60)
    d.save()
    history.record_loads(at(61))
    span.refresh_from_db()
    assert (span.ended_at, span.failed) == (at(60), False)


def test_a_load_seen_only_once_loaded_and_a_failed_load():
    srv = factories.server("gpu-1")
    quick = factories.deployment(
        srv, "quick", state=DS.LOADED, load_started_at=at(0), loaded_at=at(0.5)
    )
    failing = factories.deployment(srv, "bad", state=DS.LOADING, load_started_at=at(0))
    history.record_loads(at(1))
    failing.state, failing.state_changed_at = DS.FAILED, at(2)
    failing.save()
    history.record_loads(at(3))
    spans = {s.model: s for s in LoadSpan.objects.all()}
    assert (spans["quick"].started_at, spans["quick"].loaded_at) == (at(0), at(0.5))
    assert (spans["bad"].ended_at, spans["bad"].failed) == (at(2), True)
    assert quick.pk == spans["quick"].deployment_id


def test_minutes_are_rolled_up_once_with_finished_counts_waits_and_the_line():
    minute = history.floor_minute(NOW)
    for wait in (1, 2, 3, 10):
        factories.request(
            "m",
            Priority.INTERACTIVE,
            state=State.COMPLETED,
            created_at=minute - timedelta(seconds=40 + wait),
            started_at=minute - timedelta(seconds=40),
            finished_at=minute - timedelta(seconds=30),
        )
    factories.request("m", Priority.BACKGROUND)  # waiting now
    assert history.roll_up(NOW) == 4  # the minute just ended, each class
    assert history.roll_up(NOW) == 0  # not twice
    stats = {s.priority: s for s in MinuteStat.objects.all()}
    top = stats[Priority.INTERACTIVE]
    assert (top.minute, top.finished, top.wait_p50_s, top.wait_p95_s) == (
        minute - timedelta(minutes=1),
        4,
        2.0,
        10.0,
    )
    assert (top.waiting, stats[Priority.BACKGROUND].waiting) == (0, 1)

    # After a gap, the missed minutes are rolled up without a line's length.
    assert history.roll_up(NOW + timedelta(minutes=3)) == 3 * 4
    assert MinuteStat.objects.filter(waiting__isnull=True).count() == 2 * 4


def test_each_request_counts_in_the_minute_it_finished_to_the_microsecond():
    """The rollup reads seconds the database computes, not timestamps: a request that ends
    a microsecond before a minute's end counts in that minute and one that ends on the next
    minute's first microsecond in the next; each wait keeps its microseconds, also where a
    timestamp has none (SQLite stores it then without a fraction)."""
    last = history.floor_minute(NOW) - timedelta(minutes=1)  # the minute just ended
    ends = {
        last - timedelta(microseconds=1): 0.000001,  # the minute before's last microsecond
        last: 1.5,  # whole seconds at both ends: no fraction stored
        last + timedelta(seconds=59, microseconds=999_999): 2.999_999,
    }
    for finished_at, wait in ends.items():
        factories.request(
            "m",
            Priority.NORMAL,
            state=State.COMPLETED,
            created_at=finished_at - timedelta(seconds=wait + 0.25),
            started_at=finished_at - timedelta(seconds=0.25),
            finished_at=finished_at,
        )

    assert history.roll_up(NOW - timedelta(minutes=1)) == 4  # the minute before, alone
    assert history.roll_up(NOW) == 4
    normal = {s.minute: s for s in MinuteStat.objects.filter(priority=Priority.NORMAL)}
    before = normal[last - timedelta(minutes=1)]
    exact = functools.partial(pytest.approx, abs=1e-9)
    assert (before.finished, before.wait_p50_s) == (1, exact(0.000001))
    assert (normal[last].finished, normal[last].wait_p50_s, normal[last].wait_p95_s) == (
        2,
        exact(1.5),
        exact(2.999_999),
    )

    # Read over several minutes at once, as a backfill does, and at the charts' minute.
    waits = history.minute_rows(last - timedelta(minutes=1), NOW)
    assert {key: sorted(values) for key, values in waits.items()} == {
        (last - timedelta(minutes=1), Priority.NORMAL): exact([0.000001]),
        (last, Priority.NORMAL): exact([1.5, 2.999_999]),
    }


def test_etas_are_stamped_for_the_head_and_checked_when_sent():
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(srv, "m", state=DS.LOADED, avg_inference_s=4.0)
    first = factories.request("m", created_at=at(-2))
    second = factories.request("m", created_at=at(-1))
    eta_checks.record(at(0))
    checks = {c.request_id: c for c in EtaCheck.objects.all()}
    assert (checks[first.pk].given_s, checks[first.pk].position) == (0.0, 1)
    assert (checks[second.pk].given_s, checks[second.pk].position) == (4.0, 2)

    # The first is sent at once; the second moves up, and is sent 5 s after it was told 4.
    first.state, first.started_at, first.server, first.deployment = (
        State.PROCESSING,
        at(0.5),
        srv,
        d,
    )
    first.save()
    eta_checks.record(at(1))
    second_check = EtaCheck.objects.get(pk=second.pk)
    assert (second_check.last_position, second_check.position) == (1, 2)
    second.state, second.started_at = State.PROCESSING, at(5)
    second.save()
    first.state, first.finished_at = State.COMPLETED, at(4.9)
    first.save()
    eta_checks.record(at(6))
    checks = {c.request_id: c for c in EtaCheck.objects.all()}
    assert checks[first.pk].error_s == 0.5
    assert checks[second.pk].error_s == 1.0
    accuracy = eta_checks.accuracy(at(7))
    assert (accuracy.checked, accuracy.within) == (2, 2)  # within 1 s, and 25% of 4 s


def test_a_loads_eta_follows_its_servers_figure_and_a_stream_is_told_when_it_moves():
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(
        srv, "m", state=DS.LOADING, avg_load_s=10.0, load_started_at=at(-5), load_progress=0.25
    )
    r = factories.request("m", state=State.NEEDS_LOADING, server=srv, deployment=d)
    # A quarter done after 5 s: 15 s to go, not the estimate's 5.
    assert forecast.head(NOW).etas[r.pk] == 15.0
    eta_checks.record(at(0))
    assert eta_checks.left_s(r.pk, at(4)) == 11.0

    # Still a quarter done 5 s later: the forecast (30 s) is no longer the last one counted
    # down (10 s), so it is recorded for the stream though the place has not changed; the
    # first ETA, the one judged, stays.
    eta_checks.record(at(5))
    assert eta_checks.left_s(r.pk, at(5)) == 30.0
    assert EtaCheck.objects.get(pk=r.pk).given_s == 15.0

    # Half done after 20 s: 20 s to go, as the last one counted down says; nothing written.
    Deployment.objects.filter(pk=d.pk).update(load_progress=0.5)
    eta_checks.record(at(15))
    assert EtaCheck.objects.get(pk=r.pk).last_at == at(5)


def test_a_load_whose_victim_still_unloads_has_all_of_its_time_left():
    """12 s after `m`'s load began, `old` still unloads for it (its server letting what
    others sent it finish): the load has not begun, and 10 s are left, not "any moment"."""
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(
        srv, "m", state=DS.LOADING, avg_load_s=10.0, load_started_at=at(-12), load_progress=0.0
    )
    factories.deployment(srv, "old", state=DS.UNLOADING)
    r = factories.request("m", state=State.NEEDS_LOADING, server=srv, deployment=d)
    assert forecast.head(NOW).etas[r.pk] == 10.0


def test_a_request_its_teams_quota_holds_is_sent_once_the_team_has_room():
    """A team held to one request at a time runs one on `m` (4 s of its expected 10 s
    left); its key's next request waits though the server has a free slot: 6 s, not "any
    moment". A request of a key in no team goes at once."""
    srv = factories.server("gpu-1", slots=4)
    d = factories.deployment(srv, "m", state=DS.LOADED, avg_inference_s=10.0)
    team = Team.objects.create(name="research", max_processing=1)
    key, _ = ApiKey.generate("a", team=team)
    key.save()
    other, _ = ApiKey.generate("b")
    other.save()
    factories.request(
        "m", state=State.PROCESSING, server=srv, deployment=d, api_key=key, started_at=at(-4)
    )
    held = factories.request("m", api_key=key)
    free = factories.request("m", api_key=other)
    etas = forecast.head(NOW).etas
    assert (etas[held.pk], etas[free.pk]) == (6.0, 0.0)


def test_history_json_has_every_minute_of_the_range_and_the_timeline(client):
    User.objects.create_superuser("op", "op@example.com", "pw-long-enough")
    client.login(username="op", password="pw-long-enough")
    factories.server("gpu-1")
    LoadSpan.objects.create(
        deployment_id=1, server="gpu-1", model="m", started_at=timezone.now() - timedelta(minutes=5)
    )
    now = timezone.now()
    factories.request(
        "m",
        Priority.HIGH,
        state=State.COMPLETED,
        created_at=now - timedelta(seconds=12),
        started_at=now - timedelta(seconds=4),
        finished_at=now - timedelta(seconds=1),
    )
    body = client.get("/dashboard/history.json?range=6h").json()
    assert body["p95_wait_15m_s"] == {
        "interactive": None,
        "high": 8.0,
        "normal": None,
        "background": None,
    }
    assert len(body["minutes"]) == 360
    assert body["classes"] == ["interactive", "high", "normal", "background"]
    assert len(body["finished"]["normal"]) == 360
    assert body["timeline"][0]["server"] == "gpu-1"
    assert body["timeline"][0]["spans"][0]["model"] == "m"
    bad = client.get("/dashboard/history.json?range=7d")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "range"


def test_the_timeline_puts_stays_at_once_on_rows_of_their_own():
    """Each stay takes the first row free by its start; a load that starts just before the
    stay it ends has ended (the unload's last moments) stays on that row."""
    factories.server("gpu-1")
    factories.server("gpu-2")

    def stay(server: str, model: str, start_s: float, end_s: float | None) -> None:
        LoadSpan.objects.create(
            deployment_id=1,
            server=server,
            model=model,
            started_at=NOW + timedelta(seconds=start_s),
            ended_at=None if end_s is None else NOW + timedelta(seconds=end_s),
        )

    stay("gpu-1", "a", 0, 100)
    stay("gpu-1", "embed", 10, None)
    stay("gpu-1", "b", 99.95, 200)  # a swap: began 50 ms before a was gone
    stay("gpu-1", "c", 150, 180)  # b still there: the first row free is a third
    stay("gpu-1", "d", 185, None)
    lanes = charts.timeline(NOW - timedelta(hours=1), NOW + timedelta(seconds=300))
    assert [(lane["server"], lane["rows"]) for lane in lanes] == [("gpu-1", 3), ("gpu-2", 1)]
    assert [(s["model"], s["row"]) for s in lanes[0]["spans"]] == [
        ("a", 0),
        ("embed", 1),
        ("b", 0),
        ("c", 2),
        ("d", 2),
    ]


def test_history_json_is_for_staff_only(client):
    response = client.get("/dashboard/history.json")
    assert response.status_code == 302


def test_the_class_summary_counts_and_limits():
    factories.request("m", Priority.HIGH, created_at=NOW - timedelta(seconds=30))
    factories.request("m", Priority.HIGH, state=State.PROCESSING)
    rows = {r["class"]: r for r in charts.class_summary(NOW)}
    assert (rows["high"]["waiting"], rows["high"]["processing"]) == (1, 1)
    assert rows["high"]["oldest_wait_s"] == 30.0
    assert rows["high"]["max_wait_s"] == 300.0
    assert rows["normal"]["oldest_wait_s"] is None


def test_the_eta_accuracy_is_in_metrics(client, settings):
    settings.METRICS_TOKEN = "scrape"  # /metrics needs it (or a staff login)
    for given_s, error_s in ((10.0, 1.0), (10.0, 5.0), (0.0, 0.5)):
        EtaCheck.objects.create(
            request_id=uuid.uuid4(),
            priority=Priority.NORMAL,
            given_at=at(-100),
            given_s=given_s,
            position=1,
            last_at=at(-100),
            last_s=given_s,
            last_position=1,
            started_at=timezone.now() - timedelta(minutes=5),
            error_s=error_s,
        )
    text = client.get("/metrics", headers={"Authorization": "Bearer scrape"}).content.decode()
    assert "switchyard_eta_checked 3.0" in text
    assert "switchyard_eta_within_ratio 0.6666" in text
    assert "switchyard_eta_median_error_seconds 1.0" in text


@pytest.mark.parametrize(
    ("ran", "expected_s"),
    [
        ({"m": 2.0, "other": 8.0}, 2.0),  # the same model, on another server
        ({"other": 3.0, "third": 5.0}, 4.0),  # the mean of the models that ran
        ({}, DEFAULT_RUN_S),  # nothing ran yet
    ],
)
def test_a_model_never_run_on_a_server_is_expected_to_run_as_it_did_elsewhere(ran, expected_s):
    """The second of two requests on gpu-2's one slot waits for the first's run. m never
    ran there: its run on a server now down, else the mean of what ran, else 5 s (as
    `simulate`'s forecast expects). Breaks if every never-run deployment were 5 s."""
    down = factories.server("gpu-1", health="down")
    for name, run_s in ran.items():
        factories.deployment(down, name, avg_inference_s=run_s)
    factories.deployment(factories.server("gpu-2", slots=1), "m", state=DS.LOADED)
    first, second = (factories.request("m", created_at=at(-i)) for i in (2, 1))
    etas = forecast.head(NOW).etas
    assert (etas[first.pk], etas[second.pk]) == (0.0, expected_s)


def test_the_forecast_uses_the_run_time_of_the_requests_class():
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(srv, "m", state=DS.LOADED, avg_inference_s=2.0)
    minute = history.floor_minute(NOW)
    for _ in range(2):  # background jobs of this model ran 30 s each in the last minute
        background_ran(minute - timedelta(seconds=50), 30, server=srv, deployment=d)
    history.roll_up(NOW)
    assert RunStat.objects.get().run_s == 30.0
    jobs = [factories.request("m", Priority.BACKGROUND, created_at=at(-i)) for i in (3, 2)]
    chat = factories.request("m", Priority.INTERACTIVE, created_at=at(-1))
    line = forecast.head(NOW)
    assert [line.etas[r.pk] for r in (chat, *jobs)] == [0.0, 2.0, 32.0]

    # The next minute's 10 s jobs move it by RUN_WEIGHT of the way.
    background_ran(minute + timedelta(seconds=10), 10)
    history.roll_up(NOW + timedelta(minutes=1))
    assert RunStat.objects.get().run_s == 30.0 - history.RUN_WEIGHT * 20


def test_a_request_that_asks_for_fewer_tokens_is_expected_to_end_sooner():
    """Background jobs of `m` took 4 s for 100 tokens and 8 s for 300, answers no cap cut
    short (as the servers counted them): 2 s for the prompt and 0.02 s a token, 200 tokens
    on average. A job that asks for 50 tokens at most is expected to run 3 s; one that says
    nothing, or asks for more than they generate, 6 s."""
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(srv, "m", state=DS.LOADED, avg_inference_s=5.0)
    minute = history.floor_minute(NOW)
    for ran, tokens in ((4, 100), (8, 300)):
        background_ran(minute - timedelta(seconds=30), ran, tokens, server=srv, deployment=d)
    history.roll_up(NOW)
    stat = RunStat.objects.get()
    assert (stat.run_s, stat.base_s, stat.token_s, stat.natural_tokens) == pytest.approx(
        (6.0, 2.0, 0.02, 200)
    )

    def job(created: int, **asked) -> Request:
        return factories.request(
            "m", Priority.BACKGROUND, created_at=at(created), payload=chat(**asked)
        )

    short, unsaid, long, last = job(-4, max_tokens=50), job(-3), job(-2, max_tokens=1000), job(-1)
    etas = forecast.head(NOW).etas
    assert [etas[r.pk] for r in (short, unsaid, long, last)] == pytest.approx([0.0, 3.0, 9.0, 15.0])

    # A class that has not run yet: on the token line of the model's other classes, not
    # its deployment's average (5 s).
    Request.objects.filter(state=State.PENDING).delete()
    chats = [
        factories.request("m", Priority.INTERACTIVE, created_at=at(-i), payload=chat(max_tokens=5))
        for i in (2, 1)
    ]
    etas = forecast.head(NOW).etas
    assert [etas[r.pk] for r in chats] == pytest.approx([0.0, 2.1])


def capped_answers(answers: list[tuple[float, int, int]]) -> None:
    """`m` loaded on a one-slot server, and background answers of it (seconds run, tokens
    generated, tokens asked for at most) in the minute before NOW, rolled up."""
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(srv, "m", state=DS.LOADED, avg_inference_s=5.0)
    started = history.floor_minute(NOW) - timedelta(seconds=30)
    for ran, tokens, cap in answers:
        payload = chat(max_tokens=cap)
        background_ran(started, ran, tokens, server=srv, deployment=d, payload=payload)
    history.roll_up(NOW)


def eta_behind_one_asking_for(cap: int) -> float:
    """The ETA of a request behind one that asks for `cap` tokens at most (sent at once)."""
    asking = factories.request(
        "m", Priority.BACKGROUND, created_at=at(-2), payload=chat(max_tokens=cap)
    )
    behind = factories.request("m", Priority.BACKGROUND, created_at=at(-1))
    etas = forecast.head(NOW).etas
    assert etas[asking.pk] == 0.0
    return etas[behind.pk]


def test_answers_cut_at_their_cap_say_a_request_runs_as_long_as_it_asks():
    """Every answer so far was as long as its request allowed (16 tokens in 1.1 s, 200 in
    13.3 s): no natural length is known, so a request for 200 is expected to run 13.3 s,
    not the class's mean of 7.2 s."""
    capped_answers([(1.1, 16, 16), (13.3, 200, 200)])
    assert RunStat.objects.values_list("natural_tokens", flat=True).get() is None
    assert eta_behind_one_asking_for(200) == pytest.approx(13.3)


def test_answers_mostly_cut_at_their_cap_are_not_taken_for_the_few_that_ended_alone():
    """Twelve answers cut at their cap of 150 tokens and one that ended by itself after 2:
    answers run long, and a request for 150 is expected to run all 150 (1.5 s), not 2
    tokens' worth (it was, as the mean of the answers that ended alone)."""
    capped_answers([(1.5, 150, 150)] * 12 + [(0.02, 2, 150)])
    assert RunStat.objects.values_list("natural_tokens", flat=True).get() == 1802
    assert eta_behind_one_asking_for(150) == pytest.approx(1.5)


def test_one_count_of_tokens_draws_no_line():
    """The prompt's part and the tokens' cannot be told apart: the run time alone counts."""
    minute = history.floor_minute(NOW)
    for _ in range(2):
        background_ran(minute - timedelta(seconds=30), 4, 100)
    history.roll_up(NOW)
    assert RunStat.objects.values_list("base_s", "token_s").get() == (None, None)


def test_a_running_request_that_asks_for_few_tokens_frees_its_slot_sooner():
    """Its model and class run 6 s, 2 s + 0.02 s a token: one running for 1 s that asks
    for 50 tokens at most ends in 2 s (not 5), and the request behind it is sent then."""
    srv = factories.server("gpu-1", slots=1)
    d = factories.deployment(srv, "m", state=DS.LOADED, avg_inference_s=5.0)
    RunStat.objects.create(
        model_id=d.model_id,
        priority=Priority.BACKGROUND,
        run_s=6.0,
        base_s=2.0,
        token_s=0.02,
        natural_tokens=200,
        updated_at=NOW,
    )
    payload = chat(max_tokens=50)
    running = factories.request(
        "m",
        Priority.BACKGROUND,
        state=State.PROCESSING,
        server=srv,
        deployment=d,
        started_at=at(-1),
        payload=payload,
    )
    behind = factories.request("m", Priority.BACKGROUND, created_at=at(-1))
    assert forecast.head(NOW).etas[behind.pk] == pytest.approx(2.0)
    assert state.run_left_s(running, NOW) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("payload", "asked"),
    [
        ({"max_tokens": 16}, 16),
        ({"max_completion_tokens": 32}, 32),
        ({"max_output_tokens": 64}, 64),
        ({"max_tokens": True}, None),
        ({"max_tokens": 0}, None),
        ({}, None),
        (None, None),
    ],
)
def test_the_tokens_a_request_asks_for(payload, asked):
    assert forecast.asked_tokens(payload) == asked

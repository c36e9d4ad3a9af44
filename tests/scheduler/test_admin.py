"""Admin for requests, traces and workers, through the test client as a superuser."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from access.models import ApiKey, Team
from backends.models import Deployment
from scheduler.models import Request, State, Trace, Worker
from tests import factories
from tests.support.admin_pages import act, assert_renders_with_each_filter

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def changelist(name: str) -> str:
    return reverse(f"admin:scheduler_{name}_changelist")


@pytest.fixture
def queue():
    """One request in each state that matters, with a trace row each."""
    sim = factories.server("sim-1", kind="simulated")
    worker = Worker.objects.create(host="box", pid=42)
    rows = {}
    at = factories.deployment(sim, "qwen3-8b", state="loaded", in_flight=1)
    for state in [State.PENDING, State.NEEDS_LOADING, State.READY, State.PROCESSING]:
        busy = {"worker": worker, "deployment": at} if state == "processing" else {}
        rows[state] = factories.request("qwen3-8b", state=state, server=sim, **busy)
    rows[State.COMPLETED] = factories.request("nomic-embed", kind="embedding", state="completed")
    for row in rows.values():
        Trace.objects.create(request=row, to_state=row.state, server="sim-1", reason="seeded")
    return rows


FILTERS = {
    "request": [
        "state=pending",
        "priority=2",
        "kind=embedding",
        "stream__exact=0",
        "q=qwen",
        f"created_at__year={timezone.now().year}",
    ],
    "trace": ["to_state=ready", "server=sim-1", "q=seeded"],
    "worker": ["alive=yes", "alive=no", "host=box", "q=box"],
}


def test_request_page_shows_the_answers_words_and_folds_its_json(admin_client):
    """The answer as the dashboard shows it (its text, the tools it calls), in a box of its
    own; the stored JSON (usage, ids) folded beneath; the body indented, escaped."""
    call = {"function": {"name": "look", "arguments": '{"city": "Oslo"}'}}
    message = {"content": "It is <b>sunny</b>.", "tool_calls": [call]}
    result = {"id": "chatcmpl-9", "choices": [{"message": message}], "usage": {"total_tokens": 7}}
    r = factories.request("m", state=State.COMPLETED, result=result)
    html = admin_client.get(reverse("admin:scheduler_request_change", args=[r.pk])).content
    html = html.decode()
    answer = html.split('<div class="sy-answer" tabindex="0">')[1].split("</div>")[0]
    assert answer == "It is &lt;b&gt;sunny&lt;/b&gt;.\n→ look({&quot;city&quot;: &quot;Oslo&quot;})"
    folded = html.split("<details>")[1].split("</details>")[0]
    assert "The answer as stored (JSON)" in folded and "&quot;total_tokens&quot;: 7" in folded
    body = '<pre class="sy-body" tabindex="0">{\n  &quot;model&quot;: &quot;m&quot;'
    assert body in html  # indented


@pytest.mark.parametrize("name", FILTERS)
def test_changelists_render_with_each_filter(admin_client, queue, name):
    assert_renders_with_each_filter(admin_client, changelist(name), FILTERS[name])


def test_request_search_by_model_and_by_id(admin_client, queue):
    found = admin_client.get(changelist("request") + "?q=nomic").context["cl"].result_list
    assert [r.model_name for r in found] == ["nomic-embed"]
    ready = queue[State.READY]
    found = admin_client.get(f"{changelist('request')}?q={ready.pk}").context["cl"].result_list
    assert [r.pk for r in found] == [ready.pk]


def test_trace_search_by_request(admin_client, queue):
    ready = queue[State.READY]
    found = admin_client.get(f"{changelist('trace')}?q={ready.pk}").context["cl"].result_list
    assert [t.request_id for t in found] == [ready.pk]


def test_worker_alive_filter(admin_client, queue):
    Worker.objects.create(host="gone", pid=7, last_heartbeat=timezone.now() - timedelta(hours=1))
    alive = admin_client.get(changelist("worker") + "?alive=yes").context["cl"].result_list
    stale = admin_client.get(changelist("worker") + "?alive=no").context["cl"].result_list
    assert [w.host for w in alive] == ["box"]
    assert [w.host for w in stale] == ["gone"]
    assert alive[0].n_processing == 1


def test_request_and_trace_lists_show_the_newest_first(admin_client):
    long_ago = timezone.now() - timedelta(hours=1)
    old = factories.request("m", priority=0, state=State.COMPLETED, created_at=long_ago)
    new = factories.request("m", priority=3)
    for r in (old, new):
        Trace.objects.create(request=r, to_state=r.state, reason=f"about {r.pk}")

    requests = admin_client.get(changelist("request")).content.decode()
    traces = admin_client.get(changelist("trace")).content.decode()

    assert requests.index(str(new.pk)) < requests.index(str(old.pk))
    assert traces.index(f"about {new.pk}") < traces.index(f"about {old.pk}")


def test_waited_counts_a_waiting_request_to_now_and_is_never_negative(admin_client):
    """A request still in line shows how long it has waited so far (it said "-"); one
    whose end was stamped by a host whose clock is behind shows 0.0 s, not "-0.0 s"."""
    now = timezone.now()
    waiting = factories.request("m", created_at=now - timedelta(seconds=42))
    skewed = factories.request(
        "m", state=State.FAILED, created_at=now, finished_at=now - timedelta(seconds=0.01)
    )
    sent = factories.request(
        "m",
        state=State.COMPLETED,
        created_at=now - timedelta(seconds=30),
        started_at=now - timedelta(seconds=25),
        finished_at=now,
    )
    assert 42 <= waiting.waited_s(timezone.now()) < 50
    assert skewed.waited_s(now) == 0.0 and sent.waited_s(now) == 5.0

    page = admin_client.get(changelist("request"))
    cl = page.context["cl"]
    waited = {r.pk: cl.model_admin.waited(r) for r in cl.result_list}
    assert waited[waiting.pk].startswith("4") and waited[skewed.pk] == "0.0 s"
    assert waited[sent.pk] == "5.0 s" and "-0.0 s" not in page.content.decode()


def test_simulated_server_is_marked_in_the_request_list(admin_client, queue):
    page = admin_client.get(changelist("request")).content.decode()
    assert "sim-1 (simulated)" in page


def test_request_page_shows_its_trace_and_is_read_only(admin_client, queue):
    ready = queue[State.READY]
    url = reverse("admin:scheduler_request_change", args=[ready.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "seeded" in html
    assert 'name="_save"' not in html
    assert admin_client.post(url, {"state": "completed"}).status_code == 403
    assert Request.objects.get(pk=ready.pk).state == State.READY
    assert admin_client.get(reverse("admin:scheduler_request_add")).status_code == 403
    assert admin_client.get(f"{url}delete/").status_code == 403


def test_request_page_says_why_it_waits_in_words_not_the_policys_json(admin_client):
    sim = factories.server("sim-1")
    d = factories.deployment(sim, "m", state="loading", load_started_at=timezone.now())
    reason = {"kind": "loading", "text": "waiting for the load of m on sim-1 (~8.0 s)"}
    r = factories.request("m", state=State.NEEDS_LOADING, server=sim, deployment=d, reason=reason)
    html = admin_client.get(reverse("admin:scheduler_request_change", args=[r.pk])).content
    html = html.decode()
    assert "waiting for the load of m on sim-1" in html
    assert '"kind"' not in html and "loading&quot;" not in html
    for heading in ("Where it is", "When", "Body and answer"):
        assert f">{heading}<" in html


def test_cancel_action_cancels_what_has_not_ended_and_traces_it(admin_client, queue):
    """Waiting requests leave the line; the processing one is stopped at its server, its
    slot freed; the finished one is left alone."""
    page = act(admin_client, changelist("request"), "cancel", [r.pk for r in queue.values()])

    assert "Cancelled 4 request(s)." in page
    assert "1 request(s) had already ended and were left alone" in page
    states = {s: Request.objects.get(pk=r.pk).state for s, r in queue.items()}
    assert states == {
        State.PENDING: State.CANCELLED,
        State.NEEDS_LOADING: State.CANCELLED,
        State.READY: State.CANCELLED,
        State.PROCESSING: State.CANCELLED,
        State.COMPLETED: State.COMPLETED,
    }
    trace = Trace.objects.filter(request=queue[State.READY]).last()
    assert (trace.from_state, trace.to_state) == (State.READY, State.CANCELLED)
    assert "cancelled in admin by admin" in trace.reason
    assert Request.objects.get(pk=queue[State.READY].pk).finished_at is not None
    stopped = Trace.objects.filter(request=queue[State.PROCESSING]).last()
    assert (stopped.from_state, stopped.server) == (State.PROCESSING, "sim-1")
    assert Deployment.objects.get(model__name="qwen3-8b").in_flight == 0
    assert not Trace.objects.filter(request=queue[State.COMPLETED], to_state="cancelled").exists()


def test_cancel_action_on_nothing_cancellable_says_so(admin_client, queue):
    page = act(admin_client, changelist("request"), "cancel", [queue[State.COMPLETED].pk])
    assert "Cancelled" not in page
    assert "1 request(s) had already ended and were left alone" in page


@pytest.mark.parametrize("name", ["request", "trace", "worker"])
def test_list_pages_do_not_query_per_row(admin_client, django_assert_max_num_queries, name):
    def add_rows(n: int, start: int) -> None:
        for i in range(start, start + n):
            srv = factories.server(f"s-{i}", kind="simulated" if i % 2 else "openai")
            worker = Worker.objects.create(host=f"h-{i}", pid=i)
            key, _ = ApiKey.generate(f"app-{i}")
            key.team = Team.objects.create(name=f"team-{i}")
            key.save()
            row = factories.request(
                f"m-{i}", server=srv, worker=worker, state="processing", api_key=key
            )
            Trace.objects.create(request=row, to_state="processing", server=srv.name, reason="x")

    add_rows(1, 0)
    with CaptureQueriesContext(connection) as one_row:
        assert admin_client.get(changelist(name)).status_code == 200
    add_rows(20, 1)
    with django_assert_max_num_queries(len(one_row)):
        assert admin_client.get(changelist(name)).status_code == 200


def test_request_list_names_each_caller_and_its_team(admin_client):
    research = Team.objects.create(name="research")
    alice, _ = ApiKey.generate("alice")
    alice.team = research
    alice.save()
    bob, _ = ApiKey.generate("bob")
    bob.save()
    for key in (alice, bob, None):
        factories.request("qwen3-8b", api_key=key)
    page = admin_client.get(changelist("request")).content.decode()
    assert '<td class="field-caller">alice (research)</td>' in page
    assert '<td class="field-caller">bob</td>' in page
    assert '<td class="field-caller">-</td>' in page


def test_request_list_says_why_each_waits_and_how_each_failed(admin_client):
    """A waiting request shows its stored reason as the pages do; a failed one its error
    code and message; a completed one nothing."""
    waiting = factories.request(
        "qwen3-8b",
        reason={"kind": "no_room", "text": "no load of qwen3-8b can start now: gpu-a is busy"},
    )
    factories.request(
        "qwen3-8b",
        state=State.FAILED,
        error_code="no_server_available",
        error="no server can serve qwen3-8b: gpu-a is down",
    )
    factories.request("qwen3-8b", state=State.COMPLETED)

    page = admin_client.get(changelist("request")).content.decode()

    assert "no load of qwen3-8b can start now: gpu-a is busy" in page
    assert "no_server_available: no server can serve qwen3-8b: gpu-a is down" in page
    detail = admin_client.get(reverse("admin:scheduler_request_change", args=[waiting.pk]))
    assert "no load of qwen3-8b can start now" in detail.content.decode()


def test_a_request_page_links_to_every_turn_of_its_conversation(admin_client):
    """The conversation's short key links to the list of its turns (found by its key), and
    the server of its last turn is shown beside it."""
    sim = factories.server("sim-1")
    key = "a70a88d045ffe1e85ca0685b57e7632d"
    first = factories.request("m", state=State.COMPLETED, server=sim, affinity_key=key)
    second = factories.request("m", affinity_key=key, cache_server=sim)
    factories.request("m", affinity_key="0" * 32)  # another conversation
    html = admin_client.get(reverse("admin:scheduler_request_change", args=[second.pk]))
    html = html.content.decode()
    link = f"{changelist('request')}?q={key}"
    assert f'<a href="{link}">a70a88d0… (its turns)</a>' in html
    assert "Last turn&#x27;s server" in html and "sim-1" in html
    turns = admin_client.get(link).content.decode()
    assert str(first.pk)[:8] in turns and str(second.pk)[:8] in turns
    assert "2 results" in turns


def test_a_requests_trace_reads_to_the_ms(admin_client, queue):
    """Its steps often share their second: the page and the traces' list tell them apart."""
    r = queue[State.PENDING]
    at = timezone.now().replace(microsecond=84_000)
    Trace.objects.filter(request=r).update(at=at)
    stamp = f"{timezone.localtime(at):%H:%M:%S}.084"
    page = admin_client.get(reverse("admin:scheduler_request_change", args=[r.pk]))
    assert page.status_code == 200 and stamp in page.content.decode()
    assert stamp in admin_client.get(changelist("trace")).content.decode()

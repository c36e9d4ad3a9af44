"""Admin for servers, models and deployments, through the test client as a superuser."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from backends.admin import in_seconds
from backends.models import Deployment, Model, Server
from scheduler.models import Intent
from tests import factories
from tests.conftest import free_port
from tests.support.admin_pages import act, assert_renders_with_each_filter
from tests.support.openai_upstream import Upstream

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords")]


def changelist(name: str) -> str:
    return reverse(f"admin:backends_{name}_changelist")


@pytest.fixture
def fleet():
    sim = factories.server("sim-1", kind="simulated")
    real = factories.server("gpu-1", kind="openai", base_url="http://127.0.0.1:9")
    factories.deployment(sim, "qwen3-8b", state="loaded")
    factories.deployment(real, "qwen3-8b", server_model_id="qwen/qwen3-8b")
    factories.deployment(real, "nomic-embed", state="failed", load_failures=3)
    Model.objects.filter(name="nomic-embed").update(type="embedding", aliases=["nomic"])
    return sim, real


FILTERS = {
    "server": ["kind=openai", "health=up", "enabled__exact=1", "q=gpu"],
    "model": ["type=embedding", "q=nomic", "deployments__server__id__exact=1"],
    "deployment": [
        "state=failed",
        "enabled__exact=0",
        "load_cause=restore",
        "server__kind=simulated",
        "model__type=llm",
        "pinned__exact=0",
        "device=gpu",
        "q=qwen",
    ],
}


@pytest.mark.parametrize("name", FILTERS)
def test_changelists_render_with_each_filter(admin_client, fleet, name):
    assert_renders_with_each_filter(admin_client, changelist(name), FILTERS[name])


def test_search_finds_the_right_rows(admin_client, fleet):
    servers = admin_client.get(changelist("server") + "?q=sim").context["cl"].result_list
    assert [s.name for s in servers] == ["sim-1"]
    models = admin_client.get(changelist("model") + "?q=nomic").context["cl"].result_list
    assert [m.name for m in models] == ["nomic-embed"]
    found = admin_client.get(changelist("deployment") + "?q=qwen/qwen3").context["cl"]
    assert [d.server.name for d in found.result_list] == ["gpu-1"]


def test_filters_narrow_the_rows(admin_client, fleet):
    failed = admin_client.get(changelist("deployment") + "?state=failed").context["cl"]
    assert [d.model.name for d in failed.result_list] == ["nomic-embed"]
    simulated = admin_client.get(changelist("server") + "?kind=simulated").context["cl"]
    assert [s.name for s in simulated.result_list] == ["sim-1"]


def test_simulated_servers_are_marked_in_list_views(admin_client, fleet):
    servers = admin_client.get(changelist("server")).content.decode()
    assert "⚠ simulated (demo)" in servers
    deployments = admin_client.get(changelist("deployment")).content.decode()
    assert "sim-1 (simulated)" in deployments
    assert "gpu-1 (simulated)" not in deployments
    models = admin_client.get(changelist("model")).content.decode()
    assert "gpu-1 (unloaded), sim-1 (simulated) (loaded)" in models


def test_model_list_says_what_each_takes_besides_text(admin_client, fleet):
    """Unknown for an LLM nobody has described, the list where said, "text only" for []."""
    factories.model("gemma", capabilities=["tools", "vision"], context_length=32768)
    factories.model("plain", capabilities=[])
    page = admin_client.get(changelist("model"))
    takes = {
        m.name: page.context["cl"].model_admin.takes(m) for m in page.context["cl"].result_list
    }
    assert takes == {
        "gemma": "tools, vision",
        "nomic-embed": "-",
        "plain": "text only",
        "qwen3-8b": "unknown",
    }
    assert "32768" in page.content.decode()


def test_server_list_says_its_health_in_one_column(admin_client, fleet):
    """Failures in a row and the end of a cooldown beside the health; models loaded out of
    those deployed there; last seen as an age."""
    _, real = fleet
    until = timezone.now().replace(microsecond=0) + timedelta(seconds=90)
    Server.objects.filter(pk=real.pk).update(
        health="cooldown",
        consecutive_failures=3,
        cooldown_until=until,
        last_seen=timezone.now() - timedelta(minutes=5),
    )
    page = admin_client.get(changelist("server")).content.decode()
    shown = f"Cooldown until {timezone.localtime(until):%H:%M:%S} (3 failures in a row)"
    assert f'<td class="field-health_column">{shown}</td>' in page
    assert '<td class="field-loaded_models">0 of 2</td>' in page  # gpu-1
    assert '<td class="field-loaded_models">1 of 1</td>' in page  # sim-1
    assert "5\xa0minutes ago</span>" in page  # timesince keeps "5 minutes" on one line


@pytest.mark.parametrize("name", ["server", "model", "deployment"])
def test_list_pages_do_not_query_per_row(admin_client, django_assert_max_num_queries, name):
    srv = factories.server("s-0", kind="simulated")
    factories.deployment(srv, "m-0")
    with CaptureQueriesContext(connection) as one_row:
        assert admin_client.get(changelist(name)).status_code == 200
    for i in range(1, 25):
        srv = factories.server(f"s-{i}", kind="openai" if i % 2 else "simulated")
        factories.deployment(srv, f"m-{i}")
        factories.deployment(srv, "m-0")
    with django_assert_max_num_queries(len(one_row)):
        assert admin_client.get(changelist(name)).status_code == 200


def test_server_actions(admin_client, fleet):
    sim, real = fleet
    Server.objects.filter(pk=real.pk).update(
        health="cooldown", cooldown_until=timezone.now() + timezone.timedelta(minutes=5)
    )

    assert "2 server(s) disabled" in act(
        admin_client, changelist("server"), "disable", [sim.pk, real.pk]
    )
    assert not Server.objects.filter(enabled=True).exists()
    assert "1 server(s) enabled" in act(admin_client, changelist("server"), "enable", [sim.pk])
    assert Server.objects.get(pk=sim.pk).enabled

    page = act(admin_client, changelist("server"), "end_cooldown", [sim.pk, real.pk])
    assert "1 server(s) will be probed now" in page
    assert Server.objects.get(pk=real.pk).cooldown_until is None


def test_check_setup_action_says_what_is_wrong_line_by_line(admin_client):
    with Upstream(["qwen3-8b"]) as upstream:
        srv = factories.server("up", kind="openai", base_url=upstream.url)
        factories.deployment(srv, "typo", server_model_id="qwen3-8B")
        response = admin_client.post(
            changelist("server"),
            {"action": "check_setup", "_selected_action": [srv.pk]},
            follow=True,
        )
    [shown] = list(response.context["messages"])
    assert shown.level_tag == "error"
    assert "up: error<br>" in str(shown)
    assert "the server lists no &#x27;qwen3-8B&#x27;" in str(shown)  # escaped, one line each


def test_sync_models_action_reports_what_it_created(admin_client):
    with Upstream(["qwen3-8b", "phi-4"]) as upstream:
        srv = factories.server("up", kind="openai", base_url=upstream.url)
        factories.model("qwen3-8b", load_timeout_s=33)
        page = act(admin_client, changelist("server"), "sync_models", [srv.pk])

    assert "up: 2 listed" in page
    assert "new deployments: qwen3-8b@up, phi-4@up" in page
    assert "new models: phi-4" in page
    assert Model.objects.get(name="qwen3-8b").load_timeout_s == 33


def test_sync_models_action_shows_an_unreachable_server_as_an_error(admin_client):
    down = factories.server("down", kind="openai", base_url=f"http://127.0.0.1:{free_port()}")
    page = act(admin_client, changelist("server"), "sync_models", [down.pk])
    assert "down: could not list models" in page
    assert not Deployment.objects.exists()


def test_reset_failed_resets_only_failed_deployments(admin_client, fleet):
    failed = Deployment.objects.get(state="failed")
    loaded = Deployment.objects.get(state="loaded")

    page = act(admin_client, changelist("deployment"), "reset_failed", [failed.pk, loaded.pk])

    assert "1 deployment(s) reset. 1 were not failed" in page
    failed.refresh_from_db()
    assert (failed.state, failed.load_failures) == ("unloaded", 0)
    assert Deployment.objects.get(pk=loaded.pk).state == "loaded"


def test_deployments_are_disabled_and_enabled_again(admin_client, fleet, caplog):
    caplog.set_level("INFO", logger="backends.admin")
    ids = list(Deployment.objects.order_by("pk").values_list("pk", flat=True))
    page = act(admin_client, changelist("deployment"), "disable", ids[:2])
    assert "2 deployment(s) disabled; the worker acts on it at its next pass." in page
    assert list(Deployment.objects.order_by("pk").values_list("enabled", flat=True)) == [
        False,
        False,
        True,
    ]
    listed = admin_client.get(changelist("deployment") + "?enabled__exact=0").content.decode()
    assert "disabled, Loaded" in listed
    assert "deployment qwen3-8b@sim-1 disabled in admin by admin" in caplog.text
    page = act(admin_client, changelist("deployment"), "enable", ids)
    assert "2 deployment(s) enabled" in page
    assert Deployment.objects.filter(enabled=True).count() == 3


def test_load_and_unload_are_asked_as_the_operator_api_asks_them(admin_client, fleet):
    """Each action records an intent per deployment for a worker to carry out, with who asked
    and where; a deployment in the wrong state for it is refused, saying why."""
    loaded = Deployment.objects.get(state="loaded")
    unloaded = Deployment.objects.get(state="unloaded")
    page = act(admin_client, changelist("deployment"), "load_now", [loaded.pk, unloaded.pk])
    assert "1 load(s) asked; a worker carries them out at its next pass" in page
    assert 'under <a href="/admin/scheduler/intent/">Intents</a>.' in page  # a link, not text
    assert "qwen3-8b@sim-1 is already loaded." in page
    [load] = Intent.objects.all()
    assert (load.action, load.deployment, load.requested_by) == ("load", unloaded, "user admin")
    assert load.traces.get().reason == "asked by user admin through the admin"

    page = act(admin_client, changelist("deployment"), "unload", [loaded.pk, unloaded.pk])
    assert "1 unload(s) asked" in page
    assert "qwen3-8b@gpu-1 is unloaded, not loaded." in page
    unload = Intent.objects.get(action="unload")
    assert (unload.deployment, unload.force) == (loaded, True)  # a busy one once it is idle


def test_a_server_can_be_added_by_bare_host_name(admin_client):
    """LAN servers are reached as http://gpu-1:1234, which Django's URL check would refuse."""
    form = {
        "name": "gpu-1",
        "kind": "lmstudio",
        "base_url": "http://gpu-1:1234",
        "slots": 2,
        "max_llm": 1,
        "max_embedding": 1,
        "max_reranking": 1,
        "enabled": "on",
        "deployments-TOTAL_FORMS": 0,
        "deployments-INITIAL_FORMS": 0,
    }
    add = reverse("admin:backends_server_add")
    assert admin_client.post(add, form).status_code == 302
    assert Server.objects.get(name="gpu-1").base_url == "http://gpu-1:1234"

    refused = admin_client.post(add, {**form, "name": "gpu-2", "base_url": "gpu-2:1234"})
    assert "not an http(s) URL with a host" in refused.content.decode()
    assert not Server.objects.filter(name="gpu-2").exists()


def test_server_page_shows_its_deployments(admin_client, fleet):
    _, real = fleet
    page = admin_client.get(reverse("admin:backends_server_change", args=[real.pk]))
    assert page.status_code == 200
    assert "qwen/qwen3-8b" in page.content.decode()


def test_deployment_list_shows_how_far_a_load_is_and_readable_averages(admin_client, fleet):
    """An operator reads the load under way (the server's own figure, or the estimate from
    its average load time, marked ~) and the averages in seconds, not raw floats."""
    sim, real = fleet
    # 300 s of 1,200: still 25% should the page take 5 s to render.
    started = timezone.now() - timedelta(seconds=300)
    factories.deployment(sim, "gemma", state="loading", load_started_at=started, avg_load_s=1200.0)
    factories.deployment(real, "llama", state="loading", load_started_at=started, load_progress=0.4)
    factories.deployment(real, "big", expected_load_s=90)  # never loaded: its operator's figure
    Deployment.objects.filter(model__name="qwen3-8b", server=sim).update(
        avg_load_s=8.017399, avg_inference_s=0.51234
    )
    page = admin_client.get(changelist("deployment")).content.decode()
    assert "loading, ~25%" in page  # estimated
    assert "loading, 40%" in page  # as the server reports
    assert '<td class="field-times">8.0 s / 0.5 s</td>' in page
    assert '<td class="field-times">~90 s expected / -</td>' in page
    assert "8.017399" not in page


def test_deployment_list_says_in_few_columns_what_keeps_it_and_what_failed(admin_client, fleet):
    sim, _ = fleet
    factories.deployment(
        sim, "gemma", pinned=True, keep_loaded_hours="mon-fri 08:00-18:00", slots=2, in_flight=1
    )
    factories.deployment(
        sim, "broken", server_model_id="org/broken-q4", load_failures=2, last_error="out of memory"
    )
    full = "model limit reached, try again later"
    factories.deployment(sim, "embed", load_failures=3, last_error_code="busy", last_error=full)
    page = admin_client.get(changelist("deployment")).content.decode()
    assert "broken (as org/broken-q4)</a>" in page and "gemma</a>" in page
    assert '<td class="field-kept">pinned, mon-fri 08:00-18:00</td>' in page
    assert '<td class="field-in_flight_column">1/2</td>' in page
    assert '<td class="field-error_column">2 failed loads: out of memory</td>' in page
    assert f'<td class="field-error_column">3 loads refused, server busy: {full}</td>' in page


def test_deployment_list_says_what_a_model_is_loaded_for_only_while_it_is(admin_client, fleet):
    """`loaded for` beside a loaded or loading model; an unloaded one's last cause is not
    shown there (it would read as a load to come), its page still has it."""
    sim, real = fleet
    Deployment.objects.filter(server=sim).update(load_cause="restore")
    gone = factories.deployment(real, "gemma", state="unloaded", load_cause="preload")
    page = admin_client.get(changelist("deployment")).content.decode()
    assert '<td class="field-loaded_for">restore on idle</td>' in page
    assert '<td class="field-loaded_for">preload</td>' not in page
    detail = admin_client.get(reverse("admin:backends_deployment_change", args=[gone.pk]))
    assert "preload" in detail.content.decode()


def test_times_under_a_tenth_of_a_second_read_in_ms():
    """A tiny model's load or run is not "0.0 s"; nothing measured yet is "-"."""
    shown = [in_seconds(v) for v in (None, 0.0, 0.034, 0.1, 2.25)]
    assert shown == ["-", "0.0 s", "34 ms", "0.1 s", "2.2 s"]

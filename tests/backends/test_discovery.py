"""Discovery: deployments for what a real server lists, never touching the operator's rows."""

from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from backends.adapters.base import ServerModel
from backends.discovery import SyncReport, fill_empty_facts, record, sync_server
from backends.models import Deployment, Model
from tests import factories
from tests.conftest import free_port
from tests.support.openai_upstream import Upstream
from tests.support.replay_server import ReplayServer, Reply

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def upstream():
    """One server for the module: it only answers GET /v1/models, which nothing changes."""
    up = Upstream(["qwen3-8b", "llama-3.2-1b", "nomic-embed-text"])
    yield up
    up.close()


@pytest.fixture
def server(upstream):
    return factories.server("up", kind="openai", base_url=upstream.url)


def test_creates_models_and_deployments_for_what_the_server_lists(server):
    report = sync_server(server)

    assert report.error == ""
    assert report.listed == 3
    assert sorted(report.created_models) == ["llama-3.2-1b", "nomic-embed-text", "qwen3-8b"]
    deployments = Deployment.objects.filter(server=server).select_related("model")
    assert sorted((d.model.name, d.server_model_id) for d in deployments) == [
        ("llama-3.2-1b", "llama-3.2-1b"),
        ("nomic-embed-text", "nomic-embed-text"),
        ("qwen3-8b", "qwen3-8b"),
    ]
    # The OpenAI listing says nothing about types: everything is an LLM until told otherwise.
    assert set(Model.objects.values_list("type", flat=True)) == {"llm"}
    assert "3 listed" in str(report)


def test_syncing_again_creates_nothing(server):
    sync_server(server)
    rows = list(Deployment.objects.order_by("pk").values())

    again = sync_server(server)

    assert again.created_deployments == again.created_models == []
    assert "nothing new" in str(again)
    assert list(Deployment.objects.order_by("pk").values()) == rows


def test_operator_settings_are_never_overwritten(server):
    # A model the operator defined, by name and by alias, and a deployment they tuned.
    mine = factories.model("qwen3-8b", type="llm", aliases=["qwen"], load_timeout_s=42)
    llama = factories.model("llama", aliases=["llama-3.2-1b"])
    tuned = factories.deployment(
        server, "qwen3-8b", server_model_id="qwen3-8b", pinned=True, device="cpu"
    )
    options = dict(tuned.load_options)

    report = sync_server(server)

    assert report.created_models == ["nomic-embed-text"]
    tuned.refresh_from_db()
    assert (tuned.pinned, tuned.device, tuned.load_options) == (True, "cpu", options)
    mine.refresh_from_db()
    assert (mine.aliases, mine.load_timeout_s) == (["qwen"], 42)
    # The server's name for llama is an alias of the operator's model: deployed under it.
    assert Deployment.objects.get(server=server, server_model_id="llama-3.2-1b").model == llama
    assert Model.objects.count() == 3


def test_a_model_already_deployed_under_another_server_name_is_skipped(server):
    factories.deployment(server, "qwen3-8b", server_model_id="qwen3-8b-q4")

    report = sync_server(server)

    assert any(s.startswith("qwen3-8b ") for s in report.skipped)
    assert Deployment.objects.filter(server=server, model__name="qwen3-8b").count() == 1


def test_same_model_on_a_second_server_shares_the_model(server, upstream):
    other_up = Upstream(["qwen3-8b"])
    try:
        other = factories.server("up-2", kind="openai", base_url=other_up.url)
        sync_server(server)
        report = sync_server(other)
    finally:
        other_up.close()

    assert report.created_models == []
    assert report.created_deployments == ["qwen3-8b@up-2"]
    assert Model.objects.get(name="qwen3-8b").deployments.count() == 2


def test_lmstudio_listing_gives_types_and_sizes():
    """LM Studio's native listing (GET /api/v1/models) says each model's type and size."""
    lmstudio = ReplayServer()
    lmstudio.on(
        "GET",
        "/api/v1/models",
        Reply(
            200,
            {
                "models": [
                    {
                        "type": "llm",
                        "publisher": "qwen",
                        "key": "qwen/qwen3-8b",
                        "size_bytes": 5 * 2**30,
                        "loaded_instances": [],
                        "format": "gguf",
                    },
                    {
                        "type": "embedding",
                        "publisher": "nomic-ai",
                        "key": "text-embedding-nomic-embed-text-v1.5",
                        "size_bytes": 84 * 2**20,
                        "loaded_instances": [{"id": "text-embedding-nomic-embed-text-v1.5"}],
                        "format": "gguf",
                    },
                ]
            },
        ),
    )
    try:
        srv = factories.server("lms", kind="lmstudio", base_url=lmstudio.url)
        report = sync_server(srv)
    finally:
        lmstudio.close()

    assert report.error == ""
    found = {
        d.server_model_id: (d.model.type, d.size_mb)
        for d in Deployment.objects.filter(server=srv).select_related("model")
    }
    assert found == {
        "qwen/qwen3-8b": ("llm", 5120),
        "text-embedding-nomic-embed-text-v1.5": ("embedding", 84),
    }


def test_sizes_fill_only_empty_facts_and_unknown_types_are_llms(server):
    """Fills empty facts on existing deployments, never replaces ones the operator set.

    No server kind reports a type outside the three, so this feeds `record` directly."""
    sized = factories.deployment(server, "a", size_mb=111, slots=1)
    unsized = factories.deployment(server, "b")
    listed = [
        ServerModel("a", type="llm", size_mb=999, slots=8),
        ServerModel("b", type="llm", size_mb=2048, slots=4),
        ServerModel("embed", type="embedding", size_mb=300),
        ServerModel("odd", type="vision"),
    ]
    report = SyncReport(server.name)

    record(server, listed, report)

    sized.refresh_from_db()
    unsized.refresh_from_db()
    assert (sized.size_mb, unsized.size_mb) == (111, 2048)
    assert (sized.slots, unsized.slots) == (1, 4)
    assert report.filled == ["b@up (size, slots)"]
    assert Model.objects.get(name="embed").type == "embedding"
    assert Deployment.objects.get(model__name="embed").size_mb == 300
    assert Model.objects.get(name="odd").type == "llm"


def test_deployments_the_server_does_not_list_are_named(server):
    """A typo in the configuration, or a model removed from the server: named in the report
    (and in the command's output), left as they are."""
    factories.deployment(server, "qwen", server_model_id="qwen3-8b")
    factories.deployment(server, "typo", server_model_id="qwen3-8B")
    out = StringIO()
    call_command("sync_models", "up", stdout=out)
    assert "not listed by the server: typo@up (qwen3-8B)" in out.getvalue()
    assert Deployment.objects.filter(model__name="typo").exists()
    assert sync_server(server).not_listed == ["typo@up (qwen3-8B)"]  # qwen is listed
    # A simulated server lists only what its process has loaded: nothing is said of it.
    demo = factories.server("sim")
    factories.deployment(demo, "m")
    assert sync_server(demo).not_listed == []


def test_ollama_names_deployments_as_they_spell_them():
    """Ollama lists `llama3.2` as `llama3.2:latest`: a deployment spelled without the tag is
    the model listed, neither created again nor reported missing."""
    ollama = ReplayServer()
    tags = {"models": [{"name": "llama3.2:latest"}, {"name": "qwen3:8b"}]}
    ollama.on("GET", "/api/tags", Reply(200, tags))
    ollama.on("GET", "/api/ps", Reply(200, {"models": [{"name": "llama3.2:latest"}]}))
    with ollama:
        server = factories.server("laptop", kind="ollama", base_url=ollama.url)
        factories.deployment(server, "llama", server_model_id="llama3.2")
        report = sync_server(server)
    assert (report.created_deployments, report.not_listed) == (["qwen3:8b@laptop"], [])
    assert sorted(server.deployments.values_list("server_model_id", flat=True)) == [
        "llama3.2",
        "qwen3:8b",
    ]


def test_unreachable_server_reports_and_creates_nothing():
    down = factories.server("down", kind="openai", base_url=f"http://127.0.0.1:{free_port()}")

    report = sync_server(down)

    assert report.error
    assert "could not list models" in str(report)
    assert not Deployment.objects.exists()


def test_command_syncs_named_servers_and_reports(server):
    out = StringIO()
    call_command("sync_models", "up", stdout=out)

    assert "new deployments" in out.getvalue()
    assert Deployment.objects.filter(server=server).count() == 3


def test_command_without_names_syncs_enabled_servers(server):
    factories.server("off", kind="openai", base_url="http://127.0.0.1:9", enabled=False)
    out = StringIO()
    call_command("sync_models", stdout=out)

    assert "up: 3 listed" in out.getvalue()
    assert "off" not in out.getvalue()


def test_command_rejects_unknown_servers_and_fails_on_unreachable_ones(server):
    with pytest.raises(CommandError, match="no such server: ghost"):
        call_command("sync_models", "up", "ghost")
    assert not Deployment.objects.exists()

    factories.server("down", kind="openai", base_url=f"http://127.0.0.1:{free_port()}")
    out = StringIO()
    with pytest.raises(CommandError, match="could not list models on: down"):
        call_command("sync_models", "up", "down", stdout=out)
    # The reachable server was still synced.
    assert Deployment.objects.filter(server=server).count() == 3


def test_a_models_unknown_capabilities_are_filled_once_and_an_operators_list_stays(server):
    """What a model takes besides text comes from the first server that says it; a list an
    operator gave (even an empty one) is never replaced."""
    factories.model("gemma", type="llm")
    factories.model("qwen", type="llm", capabilities=[])
    factories.deployment(server, "gemma", server_model_id="gemma")
    listed = [
        ServerModel("gemma", capabilities=("tools", "vision")),
        ServerModel("qwen", capabilities=("tools",)),
        ServerModel("new", capabilities=("thinking",)),
        ServerModel("old"),
    ]
    report = SyncReport(server=server.name)

    record(server, listed, report)

    found = dict(Model.objects.values_list("name", "capabilities"))
    assert found == {
        "gemma": ["tools", "vision"],
        "qwen": [],
        "new": ["thinking"],
        "old": None,
    }
    assert "gemma (capabilities: tools, vision)" in str(report)
    again = SyncReport(server=server.name)
    record(server, [ServerModel("gemma", capabilities=())], again)
    assert Model.objects.get(name="gemma").capabilities == ["tools", "vision"]
    assert not any("capabilities" in line for line in again.filled)


def test_a_models_unknown_context_is_filled_from_what_a_server_runs_it_with(server):
    """An embedding model's context too; an operator's context stays, and a server that
    says none leaves it unknown."""
    factories.model("qwen", type="llm", context_length=4096)
    factories.model("nomic", type="embedding")
    factories.deployment(server, "qwen", server_model_id="qwen")
    listed = [
        ServerModel("qwen", context_length=32768),
        ServerModel("nomic", type="embedding", context_length=2048),
        ServerModel("gemma", capabilities=("tools",), context_length=8192),
        ServerModel("old"),
    ]
    report = SyncReport(server=server.name)

    record(server, listed, report)

    found = dict(Model.objects.values_list("name", "context_length"))
    assert found == {"qwen": 4096, "nomic": 2048, "gemma": 8192, "old": None}
    assert "gemma (capabilities: tools; context_length: 8192)" in str(report)
    assert not any(line.startswith("qwen") for line in report.filled)


def test_after_a_load_only_the_facts_nobody_said_are_filled(server):
    """A load learns what its server says of the model now running; an operator's slots
    (and a model's capabilities set by anyone) stay."""
    model = Model.objects.create(name="m", capabilities=["tools"])
    learnt = Deployment.objects.create(server=server, model=model, server_model_id="m")
    said = ServerModel("m", "loaded", slots=2, capabilities=(), context_length=4096)
    assert fill_empty_facts(learnt.pk, said) == ["m (context_length: 4096)", f"{learnt} (slots)"]
    learnt.refresh_from_db()
    model.refresh_from_db()
    assert (learnt.slots, model.capabilities, model.context_length) == (2, ["tools"], 4096)
    assert fill_empty_facts(learnt.pk, replace(said, slots=8)) == []  # said once, kept
    Deployment.objects.filter(pk=learnt.pk).update(slots=None)
    assert fill_empty_facts(learnt.pk, ServerModel("m", "loaded")) == []  # it says nothing

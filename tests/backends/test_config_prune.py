"""`apply_config FILE --prune` (and `POST /api/v1/config?prune=true`): the file's lists are
the whole truth. What they leave out is deleted and named; a list the file does not have is
left alone; a team that still holds keys is not deleted; a dry run deletes nothing."""

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from access.models import ApiKey, Team
from backends.models import Deployment, Model, Server
from scheduler.models import Request, State
from tests import factories
from tests.backends.test_config_file import YAML, apply, snapshot, write

pytestmark = pytest.mark.django_db
DEMO = Path(__file__).resolve().parents[2] / "config" / "demo.yaml"


def pruned(path: str, *flags: str) -> str:
    out = StringIO()
    call_command("apply_config", path, "--prune", *flags, stdout=out)
    return out.getvalue()


def names(model) -> list[str]:
    return sorted(str(obj) for obj in model.objects.all())


def test_prune_deletes_what_the_file_leaves_out_and_names_each(tmp_path):
    apply(write(tmp_path, YAML))
    old = factories.server("old-box", kind="openai")
    factories.deployment(old, "qwen3-8b")
    factories.deployment(Server.objects.get(name="gpu-1"), "stale-model")
    Team.objects.create(name="gone")
    waiting = factories.request("stale-model")

    said = pruned(write(tmp_path, YAML))

    assert "deleted 5: deployment stale-model@gpu-1, deployment qwen3-8b@old-box, " in said
    assert "server old-box, model stale-model, team gone" in said
    assert names(Server) == ["gpu-1"]
    assert names(Model) == ["nomic-embed", "qwen3-8b"]
    assert names(Deployment) == ["nomic-embed@gpu-1", "qwen3-8b@gpu-1"]
    assert names(Team) == ["research"]
    # A request for a deleted model is kept (the scheduler ends it), by the name it asked.
    waiting.refresh_from_db()
    assert (waiting.model_id, waiting.model_name, waiting.state) == (
        None,
        "stale-model",
        State.PENDING,
    )
    assert "nothing changed" in pruned(write(tmp_path, YAML))


def test_lists_the_file_does_not_have_are_left_alone(tmp_path):
    apply(write(tmp_path, YAML))
    extra = factories.model("extra")
    factories.deployment(Server.objects.get(name="gpu-1"), "extra")
    # Servers only, and gpu-1 without a deployments list: every model, team and deployment
    # stays; only the server the list leaves out goes.
    factories.server("old-box", kind="openai")
    text = "servers:\n  - name: gpu-1\n    kind: lmstudio\n    base_url: http://gpu-1:1234\n"
    said = pruned(write(tmp_path, text))
    assert "deleted 1: server old-box" in said
    assert Model.objects.filter(pk=extra.pk).exists() and names(Team) == ["research"]
    assert "extra@gpu-1" in names(Deployment)


def test_a_team_that_holds_keys_is_not_pruned_and_nothing_changes(tmp_path):
    apply(write(tmp_path, YAML))
    team = Team.objects.create(name="ml")
    ApiKey.generate("app", team=team)[0].save()
    factories.server("old-box", kind="openai")
    before = snapshot()
    message = error_of_pruned(write(tmp_path, YAML))
    assert "team 'ml' is not in the file but holds 1 API key(s)" in message
    assert snapshot() == before


def error_of_pruned(path: str) -> str:
    with pytest.raises(CommandError) as caught:
        pruned(path)
    return str(caught.value)


def test_a_dry_run_says_what_would_go_and_deletes_nothing(tmp_path):
    apply(write(tmp_path, YAML))
    factories.server("old-box", kind="openai")
    before = snapshot()
    said = pruned(write(tmp_path, YAML), "--dry-run")
    assert said.startswith("Would apply") and "deleted 1: server old-box" in said
    assert snapshot() == before


def test_an_export_applied_with_prune_changes_nothing(tmp_path):
    apply(write(tmp_path, YAML))
    factories.deployment(factories.server("other", kind="ollama"), "qwen3-8b")
    out = StringIO()
    call_command("export_config", stdout=out)
    assert "nothing changed" in pruned(write(tmp_path, out.getvalue()))


def test_the_demo_goes_when_the_teams_own_file_is_applied_with_prune(tmp_path):
    """What the README says: `apply_config servers.yaml --prune` on the demo's database
    leaves only the file's servers and models."""
    apply(str(DEMO))
    assert Server.objects.filter(kind="simulated").exists()
    said = pruned(write(tmp_path, YAML))
    assert "server sim-gpu-1" in said and "server sim-gpu-2" in said
    assert names(Server) == ["gpu-1"] and names(Model) == ["nomic-embed", "qwen3-8b"]
    assert not Request.objects.exists()

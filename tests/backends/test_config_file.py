"""`manage.py apply_config FILE`: YAML and TOML, idempotence, and every kind of error."""

from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from access.models import ApiKey, Team
from backends.config_file import export
from backends.models import Deployment, Model, Server
from tests import factories

pytestmark = pytest.mark.django_db

YAML = """\
models:
  - name: qwen3-8b
    aliases: [qwen, qwen3]
    load_timeout_s: 90
    load_options: {context_length: 8192}
    capabilities: [tools, thinking]
    context_length: 8192
  - name: nomic-embed
    type: embedding
servers:
  - name: gpu-1
    kind: lmstudio
    base_url: http://gpu-1:1234
    slots: 4
    max_llm: 2
    memory_mb: 24000
    deployments:
      - model: qwen3-8b
        server_model_id: qwen/qwen3-8b
        size_mb: 5000
        slots: 2
        pinned: true
        keep_loaded_hours: mon-fri 08:00-18:00
        expected_load_s: 25
      - model: nomic-embed
        device: cpu
teams:
  - name: research
    weight: 2
    max_processing: 3
    daily_processing_s: 36000
    daily_tokens: 5000000
"""

TOML = """\
[[models]]
name = "qwen3-8b"
aliases = ["qwen", "qwen3"]
load_timeout_s = 90
load_options = { context_length = 8192 }
capabilities = ["tools", "thinking"]
context_length = 8192

[[models]]
name = "nomic-embed"
type = "embedding"

[[servers]]
name = "gpu-1"
kind = "lmstudio"
base_url = "http://gpu-1:1234"
slots = 4
max_llm = 2
memory_mb = 24000

[[servers.deployments]]
model = "qwen3-8b"
server_model_id = "qwen/qwen3-8b"
size_mb = 5000
slots = 2
pinned = true
keep_loaded_hours = "mon-fri 08:00-18:00"
expected_load_s = 25

[[servers.deployments]]
model = "nomic-embed"
device = "cpu"

[[teams]]
name = "research"
weight = 2
max_processing = 3
daily_processing_s = 36000
daily_tokens = 5000000
"""


def write(tmp_path: Path, text: str, suffix: str = ".yaml") -> str:
    path = tmp_path / f"switchyard{suffix}"
    path.write_text(text)
    return str(path)


def apply(path: str) -> str:
    out = StringIO()
    call_command("apply_config", path, stdout=out)
    return out.getvalue()


def error_of(path: str) -> str:
    with pytest.raises(CommandError) as caught:
        apply(path)
    return str(caught.value)


def snapshot() -> list:
    """Every row the command may touch, to prove a bad file changed nothing."""
    return [
        list(Server.objects.order_by("pk").values()),
        list(Model.objects.order_by("pk").values()),
        list(Deployment.objects.order_by("pk").values()),
        list(Team.objects.order_by("pk").values()),
    ]


@pytest.mark.parametrize("text,suffix", [(YAML, ".yaml"), (TOML, ".toml")], ids=["yaml", "toml"])
def test_creates_everything_then_changes_nothing(tmp_path, text, suffix):
    path = write(tmp_path, text, suffix)
    first = apply(path)
    assert "created 6" in first

    server = Server.objects.get(name="gpu-1")
    assert (server.kind, server.base_url, server.slots, server.max_llm, server.memory_mb) == (
        "lmstudio",
        "http://gpu-1:1234",
        4,
        2,
        24000,
    )
    qwen = Model.objects.get(name="qwen3-8b")
    assert qwen.aliases == ["qwen", "qwen3"]
    assert qwen.load_options == {"context_length": 8192}
    assert qwen.load_timeout_s == 90
    assert (qwen.capabilities, qwen.context_length) == (["tools", "thinking"], 8192)
    assert Model.objects.get(name="nomic-embed").capabilities is None  # unknown
    assert Model.objects.get(name="nomic-embed").type == "embedding"
    pinned = Deployment.objects.get(model=qwen)
    assert (pinned.server_model_id, pinned.size_mb, pinned.pinned) == ("qwen/qwen3-8b", 5000, True)
    assert pinned.keep_loaded_hours == "mon-fri 08:00-18:00"
    assert (pinned.slots, pinned.expected_load_s) == (2, 25)
    embed = Deployment.objects.get(model__name="nomic-embed")
    assert (embed.server_model_id, embed.device, embed.slots) == ("nomic-embed", "cpu", None)
    team = Team.objects.get(name="research")
    assert (team.weight, team.max_processing, team.daily_processing_s, team.daily_tokens) == (
        2,
        3,
        36000,
        5_000_000,
    )

    before = snapshot()
    assert "nothing changed" in apply(path)
    assert snapshot() == before


def test_yaml_and_toml_describe_the_same_rows(tmp_path):
    apply(write(tmp_path, YAML))
    from_yaml = snapshot()
    assert "nothing changed" in apply(write(tmp_path, TOML, ".toml"))
    assert snapshot() == from_yaml


def test_dry_run_reports_without_changing(tmp_path):
    out = StringIO()
    call_command("apply_config", write(tmp_path, YAML), "--dry-run", stdout=out)
    assert "Would apply" in out.getvalue()
    assert "created 6" in out.getvalue()
    assert snapshot() == [[], [], [], []]


def test_updates_only_what_the_file_names_and_leaves_the_rest(tmp_path):
    apply(write(tmp_path, YAML))
    other = factories.server("other", kind="openai")
    dep = Deployment.objects.get(model__name="nomic-embed")
    # Facts the runtime owns are not in the file and must survive it.
    Deployment.objects.filter(pk=dep.pk).update(
        state="loaded", avg_load_s=3.5, server_model_id="nomic-v1.5"
    )

    changed = YAML.replace("slots: 4", "slots: 6")
    assert "updated 1: server gpu-1" in apply(write(tmp_path, changed))

    assert Server.objects.get(name="gpu-1").slots == 6
    assert Server.objects.filter(pk=other.pk).exists()
    dep.refresh_from_db()
    # server_model_id defaults to the model's name only when the deployment is created.
    assert (dep.state, dep.avg_load_s, dep.server_model_id) == ("loaded", 3.5, "nomic-v1.5")


def test_a_team_keeps_its_keys_and_what_the_file_leaves_out(tmp_path):
    """Keys join a team outside the file (their secrets are never in one); applying it again
    with another quota changes the team, not its membership."""
    apply(write(tmp_path, YAML))
    team = Team.objects.get(name="research")
    key, _ = ApiKey.generate("app", team=team)
    key.save()
    changed = YAML.replace("max_processing: 3", "max_processing: 5")
    assert "updated 1: team research" in apply(write(tmp_path, changed))
    team.refresh_from_db()
    key.refresh_from_db()
    assert (team.max_processing, key.team) == (5, team)


def test_an_export_applies_back_unchanged_and_remakes_the_same_rows(tmp_path):
    """What `export_config` prints is a file: applied again it changes nothing, and on an
    empty database it makes the same servers, models, deployments and teams. A server's API
    key is never in it."""
    apply(write(tmp_path, YAML))
    Server.objects.filter(name="gpu-1").update(api_key="sk-secret-1234")
    out = StringIO()
    call_command("export_config", stdout=out)
    text = out.getvalue()
    assert "sk-secret" not in text and "api_key" not in text
    assert "nothing changed" in apply(write(tmp_path, text))
    exported = export()
    Deployment.objects.all().delete()
    Server.objects.all().delete()
    Model.objects.all().delete()
    Team.objects.all().delete()
    remade = apply(write(tmp_path, text))
    assert "created 6" in remade and "updated" not in remade  # a verb with nothing is left out
    assert export() == exported
    # Its server's name for the model is left out where it is the model's own (the default).
    assert exported["servers"][0]["deployments"][0] == {"model": "nomic-embed", "device": "cpu"}
    qwen = exported["servers"][0]["deployments"][1]
    assert qwen == {
        "model": "qwen3-8b",
        "server_model_id": "qwen/qwen3-8b",
        "size_mb": 5000,
        "slots": 2,
        "pinned": True,
        "keep_loaded_hours": "mon-fri 08:00-18:00",
        "expected_load_s": 25,
    }


def test_values_are_compared_after_conversion(tmp_path):
    """ "8" and 8 are the same slot count: quoting a number is not a change every time."""
    path = write(tmp_path, "servers:\n  - name: s\n    kind: simulated\n    slots: '8'\n")
    apply(path)
    assert Server.objects.get(name="s").slots == 8
    assert "nothing changed" in apply(path)


def test_demo_file_is_valid_and_as_advertised():
    apply(str(settings.BASE_DIR / "config" / "demo.yaml"))
    servers = Server.objects.all()
    assert [s.kind for s in servers] == ["simulated", "simulated"]
    assert Model.objects.count() == 4
    load_seconds = {d.load_options["load_seconds"] for d in Deployment.objects.all()}
    assert min(load_seconds) == 2
    assert max(load_seconds) == 20


# Each bad file: what the message must say. Every one leaves the database as it was.
YAML_ERRORS = {
    "syntax": ("models:\n  - name: a\n   bad: [\n", ["line 3"]),
    "unclosed flow": ("models:\n  - name: a\n    aliases: [x, y\n", ["line 4"]),
    "not a mapping": ("- just\n- a list\n", ["expected a mapping"]),
    "unknown top key": ("models: []\nserver: []\n", ["server (line 2)", "unknown keys"]),
    "models not a list": ("models:\n  name: a\n", ["models (line 1)", "expected a list"]),
    "model not a mapping": ("models:\n  - name: a\n  - b\n", ["models[1] (line 3)", "mapping"]),
    "model without name": ("models:\n  - type: llm\n", ["models[0].name (line 2)", "needs a name"]),
    "unknown model key": (
        "models:\n  - name: a\n    size: 3\n",
        ["models[0].size (line 3)", "unknown keys ['size']"],
    ),
    "bad choice": (
        "models:\n  - name: a\n    type: chat\n",
        ["models[0].type (line 3)", "'chat' is not a valid choice"],
    ),
    "aliases not a list": (
        "models:\n  - name: a\n    aliases: b\n",
        ["models[0].aliases (line 3)", "list of names"],
    ),
    "load options not a mapping": (
        "models:\n  - name: a\n    load_options: [1]\n",
        ["models[0].load_options (line 3)", "expected a mapping"],
    ),
    "unknown capability": (
        "models:\n  - name: a\n    capabilities: [tools, images]\n",
        ["models[0].capabilities (line 3)", "expected a list of tools, vision, thinking"],
    ),
    "capability twice": (
        "models:\n  - name: a\n    capabilities: [tools, tools]\n",
        ["models[0].capabilities (line 3)", "names a capability twice"],
    ),
    "no context": (
        "models:\n  - name: a\n    context_length: 0\n",
        ["models[0].context_length (line 3)", "greater than or equal to 1"],
    ),
    "duplicate model": (
        "models:\n  - name: a\n  - name: a\n",
        ["models[1].name (line 3)", "also models[0]"],
    ),
    "alias names another model": (
        "models:\n  - name: a\n  - name: b\n    aliases: [a]\n",
        ["models[1].aliases (line 4)", "already names model 'a'"],
    ),
    "not a number": (
        "servers:\n  - name: s\n    kind: simulated\n    slots: many\n",
        ["servers[0].slots (line 4)", "must be an integer"],
    ),
    "infinite": (
        "servers:\n  - name: s\n    slots: .inf\n",
        ["servers[0].slots (line 3)", "not a finite number"],
    ),
    "too large for any number": (
        "teams:\n  - name: t\n    weight: 1.0e+400\n",
        ["teams[0].weight (line 3)", "not a finite number"],
    ),
    "aliases that expand without bound": (
        "models:\n  - name: a\n    load_options:\n"
        + "".join(
            f"      l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else '1'] * 10)}]\n"
            for i in range(9)
        ),
        ["more than 100,000 values once its YAML aliases are expanded"],
    ),
    "negative": (
        "servers:\n  - name: s\n    slots: -1\n",
        ["servers[0].slots (line 3)", "greater than or equal to 0"],
    ),
    "bad server name": (
        "servers:\n  - name: gpu 1\n",
        ["servers[0].name (line 2)", "slug"],
    ),
    "bad port": (
        "servers:\n  - name: s\n    base_url: http://gpu-1:99999\n",
        ["servers[0].base_url (line 3)", "invalid port"],
    ),
    "bad kind": ("servers:\n  - name: s\n    kind: tgi\n", ["servers[0].kind (line 3)"]),
    "bad url": (
        "servers:\n  - name: s\n    base_url: not a url\n",
        ["servers[0].base_url (line 3)", "not an http(s) URL"],
    ),
    "duplicate server": (
        "servers:\n  - name: s\n  - name: s\n",
        ["servers[1].name (line 3)", "also servers[0]"],
    ),
    "unknown deployment model": (
        "servers:\n  - name: s\n    deployments:\n      - model: ghost\n",
        ["servers[0].deployments[0].model (line 4)", "unknown model 'ghost'"],
    ),
    "deployments not a list": (
        "servers:\n  - name: s\n    deployments: a\n",
        ["servers[0].deployments (line 3)", "expected a list"],
    ),
    "deployed twice": (
        "models:\n  - name: a\nservers:\n  - name: s\n    deployments:\n"
        "      - model: a\n      - model: a\n",
        ["servers[0].deployments[1].model (line 7)", "deployed twice"],
    ),
    "bad device": (
        "models:\n  - name: a\nservers:\n  - name: s\n    deployments:\n"
        "      - model: a\n        device: tpu\n",
        ["servers[0].deployments[0].device (line 7)", "not a valid choice"],
    ),
    "no slots": (
        "models:\n  - name: a\nservers:\n  - name: s\n    deployments:\n"
        "      - model: a\n        slots: 0\n",
        ["servers[0].deployments[0].slots (line 7)", "greater than or equal to 1"],
    ),
    "no load time": (
        "models:\n  - name: a\nservers:\n  - name: s\n    deployments:\n"
        "      - model: a\n        expected_load_s: 0\n",
        ["servers[0].deployments[0].expected_load_s (line 7)", "greater than or equal to 1"],
    ),
    "team without name": ("teams:\n  - weight: 2\n", ["teams[0].name (line 2)", "needs a name"]),
    "unknown team key": (
        "teams:\n  - name: t\n    rpm: 3\n",
        ["teams[0].rpm (line 3)", "unknown keys ['rpm']"],
    ),
    "duplicate team": ("teams:\n  - name: t\n  - name: t\n", ["teams[1].name (line 3)", "also"]),
    "team weight zero": (
        "teams:\n  - name: t\n    weight: 0\n",
        ["teams[0].weight (line 3)", "greater than or equal to 1"],
    ),
    "bad keep-loaded hours": (
        "models:\n  - name: a\nservers:\n  - name: s\n    deployments:\n"
        "      - model: a\n        keep_loaded_hours: weekdays 9-5\n",
        ["servers[0].deployments[0].keep_loaded_hours (line 7)", "HH:MM-HH:MM"],
    ),
}


TOML_ERRORS = {
    "syntax": ('[[models]]\nname = "a"\ntype = \n', ["line 3"]),
    "duplicate key": ('[[servers]]\nname = "s"\nname = "t"\n', ["line 3"]),
    "unknown key": ('[[models]]\nname = "a"\nsize = 3\n', ["models[0].size", "unknown keys"]),
    "bad choice": ('[[models]]\nname = "a"\ntype = "chat"\n', ["models[0].type", "valid choice"]),
    "not a number": ('[[servers]]\nname = "s"\nslots = "x"\n', ["servers[0].slots", "integer"]),
    "unknown deployment model": (
        '[[servers]]\nname = "s"\n[[servers.deployments]]\nmodel = "ghost"\n',
        ["servers[0].deployments[0].model", "unknown model 'ghost'"],
    ),
    "models not a list": ('[models]\nname = "a"\n', ["models: expected a list"]),
}


@pytest.mark.parametrize(
    "suffix,text,expected",
    [
        pytest.param(suffix, text, expected, id=f"{suffix[1:]}-{name}")
        for suffix, errors in [(".yml", YAML_ERRORS), (".toml", TOML_ERRORS)]
        for name, (text, expected) in errors.items()
    ],
)
def test_errors_say_where_and_change_nothing(tmp_path, suffix, text, expected):
    apply(write(tmp_path, YAML))
    before = snapshot()
    message = error_of(write(tmp_path, text, suffix))
    for part in expected:
        assert part in message
    assert snapshot() == before


def test_a_valid_part_before_an_error_is_rolled_back(tmp_path):
    apply(write(tmp_path, YAML))
    before = snapshot()
    bad = YAML.replace("slots: 4", "slots: 9").replace(
        "device: cpu\n", "device: cpu\n      - model: ghost\n"
    )
    assert "unknown model 'ghost'" in error_of(write(tmp_path, bad))
    assert snapshot() == before


def test_missing_file_is_a_clear_error(tmp_path):
    assert "cannot read" in error_of(str(tmp_path / "nope.yaml"))


def test_empty_file_is_an_error(tmp_path):
    assert "expected a mapping" in error_of(write(tmp_path, ""))


def test_a_deployment_is_disabled_in_the_file_and_exported_so(tmp_path):
    apply(write(tmp_path, YAML))
    off = YAML.replace(
        "      - model: nomic-embed\n", "      - model: nomic-embed\n        enabled: false\n"
    )
    assert "updated 1: deployment nomic-embed@gpu-1" in apply(write(tmp_path, off))
    assert list(Deployment.objects.filter(enabled=False).values_list("model__name", flat=True)) == [
        "nomic-embed"
    ]
    nomic = export()["servers"][0]["deployments"][0]
    assert (nomic["model"], nomic["enabled"]) == ("nomic-embed", False)
    assert "enabled" not in export()["servers"][0]["deployments"][1]  # the default: left out
    assert "nothing changed" in apply(write(tmp_path, off))

"""`POST /api/v1/config` applies a configuration file over HTTP as `apply_config` does (YAML,
JSON or TOML; a dry run changes nothing; a bad file answers 400 saying where, and changes
nothing); `GET /api/v1/config` answers what is configured now. Operators only."""

import pytest
import yaml

from access.models import ApiKey, Team
from backends.models import Deployment, Model, Server

pytestmark = pytest.mark.auth

FILE = """\
models:
  - name: qwen3-8b
    aliases: [qwen]
servers:
  - name: gpu-1
    kind: lmstudio
    base_url: http://gpu-1:1234
    slots: 4
    deployments:
      - model: qwen3-8b
        server_model_id: qwen/qwen3-8b
teams:
  - name: research
    weight: 2
"""


@pytest.fixture
def ops(db) -> dict[str, str]:
    key, secret = ApiKey.generate("ops", operator=True)
    key.save()
    return {"Authorization": f"Bearer {secret}"}


def send(client, body: str, headers, content_type="application/yaml", query=""):
    return client.post(f"/api/v1/config{query}", body, content_type=content_type, headers=headers)


def rows() -> list:
    return [
        list(Server.objects.order_by("pk").values()),
        list(Model.objects.order_by("pk").values()),
        list(Deployment.objects.order_by("pk").values()),
        list(Team.objects.order_by("pk").values()),
    ]


def test_a_file_applies_then_changes_nothing(client, ops):
    first = send(client, FILE, ops)
    assert first.status_code == 200, first.content
    assert first.json() == {
        "dry_run": False,
        "changed": True,
        "created": [
            "team research",
            "model qwen3-8b",
            "server gpu-1",
            "deployment qwen3-8b@gpu-1",
        ],
        "updated": [],
        "deleted": [],
    }
    assert Server.objects.get(name="gpu-1").slots == 4
    again = send(client, FILE, ops).json()
    assert (again["changed"], again["created"], again["updated"]) == (False, [], [])


def test_a_dry_run_says_what_would_change_and_changes_nothing(client, ops):
    answer = send(client, FILE, ops, query="?dry_run=true").json()
    assert answer["dry_run"] is True and len(answer["created"]) == 4
    assert rows() == [[], [], [], []]


def test_prune_deletes_what_the_file_leaves_out_a_dry_run_only_says_so(client, ops):
    send(client, FILE, ops)
    send(client, "servers:\n  - name: old-box\n    kind: openai\n", ops)
    before = rows()
    would = send(client, FILE, ops, query="?prune=true&dry_run=true").json()
    assert (would["dry_run"], would["deleted"]) == (True, ["server old-box"])
    assert rows() == before
    done = send(client, FILE, ops, query="?prune=true").json()
    assert (done["changed"], done["deleted"]) == (True, ["server old-box"])
    assert list(Server.objects.values_list("name", flat=True)) == ["gpu-1"]


def test_json_and_toml_by_their_content_type(client, ops):
    as_json = yaml.safe_load(FILE)
    assert send(client, as_json, ops, "application/json").json()["changed"] is True
    toml = '[[servers]]\nname = "gpu-1"\nslots = 6\n'
    updated = send(client, toml, ops, "application/toml").json()
    assert updated["updated"] == ["server gpu-1"]
    assert Server.objects.get(name="gpu-1").slots == 6


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("servers:\n  - name: s\n   bad: [\n", "line 3"),
        ("servers:\n  - name: s\n    slots: many\n", "servers[0].slots (line 3)"),
        ("servers:\n  - name: s\n    deployments:\n      - model: ghost\n", "unknown model"),
        ("- a list\n", "expected a mapping"),
        ('{"servers": [{"name": "s\\ud800"}]}', "lone surrogates"),
        # A billion laughs: ten to the ninth values from a few lines.
        (
            "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(
                f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n"
                for p, n in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            "more than 100,000 values",
        ),
    ],
)
def test_a_bad_file_says_where_and_changes_nothing(client, ops, body, said):
    send(client, FILE, ops)
    before = rows()
    answer = send(client, body, ops)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] in ("invalid_config", "invalid_value") and said in error["message"]
    assert rows() == before


def test_what_is_configured_now_as_json_or_as_a_file(client, ops):
    send(client, FILE, ops)
    Server.objects.filter(name="gpu-1").update(api_key="sk-secret-1234")
    now = client.get("/api/v1/config", headers=ops)
    assert now.json()["servers"][0]["slots"] == 4
    assert "sk-secret" not in now.content.decode()
    as_file = client.get("/api/v1/config?as=yaml", headers=ops)
    assert as_file["Content-Type"].startswith("application/yaml")
    assert send(client, as_file.content.decode(), ops).json()["changed"] is False


def test_only_operators_may_read_or_apply(client, db):
    app, secret = ApiKey.generate("app")
    app.save()
    for headers, status in (({}, 401), ({"Authorization": f"Bearer {secret}"}, 403)):
        assert send(client, FILE, headers).status_code == status
        assert client.get("/api/v1/config", headers=headers).status_code == status
    assert rows() == [[], [], [], []]


def test_one_deployment_disabled_by_a_file_that_names_only_it(client, ops):
    """What docs/operating.md shows: a body naming one deployment changes only that one."""
    send(client, FILE, ops)
    before = rows()
    body = {
        "servers": [{"name": "gpu-1", "deployments": [{"model": "qwen3-8b", "enabled": False}]}]
    }
    answer = send(client, body, ops, "application/json").json()
    assert answer["updated"] == ["deployment qwen3-8b@gpu-1"]
    assert Deployment.objects.get().enabled is False
    assert [r for r in rows() if r is not before[2]][:2] == before[
        :2
    ]  # servers, models as they were

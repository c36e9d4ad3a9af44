"""Declarative servers, models, deployments and teams from a YAML or TOML file.

Applying a file creates or updates what it names and leaves everything else alone, so it is
safe to apply the same file again. Every problem is reported with where it is: the line for
YAML (and for TOML syntax errors, which tomllib reports by line), the path such as
`servers[1].deployments[0].size_mb` always. A file with any problem changes nothing.
"""

import math
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import models as db
from django.db import transaction

from access.models import Team

from .models import Deployment, Model, Server

# What a file may say of each, in the order `export` writes it.
SERVER_FIELDS = (
    "kind",
    "base_url",
    "api_key",
    "enabled",
    "slots",
    "max_llm",
    "max_embedding",
    "max_reranking",
    "max_models",
    "memory_mb",
)
MODEL_FIELDS = (
    "type",
    "aliases",
    "load_timeout_s",
    "load_options",
    "capabilities",
    "context_length",
)
DEPLOYMENT_FIELDS = (
    "server_model_id",
    "enabled",
    "size_mb",
    "device",
    "slots",
    "pinned",
    "preload",
    "keep_loaded_hours",
    "idle_ttl_s",
    "expected_load_s",
    "load_options",
)

TEAM_FIELDS = ("weight", "max_processing", "daily_processing_s", "daily_tokens")
TOP_KEYS = {"models", "servers", "teams"}


class ConfigError(ValueError):
    pass


class _Mapping(dict):
    """A YAML mapping that remembers its line and the line of each key."""

    line: int | None = None
    key_lines: dict[str, int]


class _Sequence(list):
    """A YAML sequence that remembers its line and the line of each entry."""

    line: int | None = None
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode):
    mapping = _Mapping()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {
        k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)
    }
    yield mapping  # yielded first so that nested and recursive nodes can refer to it
    mapping.update(loader.construct_mapping(node))


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode):
    sequence = _Sequence()
    sequence.line = node.start_mark.line + 1
    sequence.item_lines = [item.start_mark.line + 1 for item in node.value]
    yield sequence
    sequence.extend(loader.construct_sequence(node))


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def where(item: Any, path: str, key: str | None = None) -> str:
    """`path.key` plus the YAML line of `key` in `item` (or of `item` itself) when known."""
    line = getattr(item, "key_lines", {}).get(key) if key else None
    line = line or getattr(item, "line", None)
    full = f"{path}.{key}" if path and key else (key or path)
    return f"{full} (line {line})" if line else full


@dataclass
class Summary:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)

    def __str__(self) -> str:
        if not self.changed:
            return "nothing changed"
        verbs = [("created", self.created), ("updated", self.updated), ("deleted", self.deleted)]
        return "; ".join(f"{verb} {len(said)}: {', '.join(said)}" for verb, said in verbs if said)


def load_file(path: str | Path) -> dict:
    """Parse a .toml file as TOML and anything else as YAML."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}") from exc
    return parse(text, "toml" if path.suffix == ".toml" else "yaml")


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass


def parse(text: str, fmt: str) -> dict:
    """`text` as TOML (`fmt` "toml") or YAML (anything else; JSON is YAML too)."""
    load = tomllib.loads if fmt == "toml" else _load_yaml
    try:
        data = load(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(exc)) from exc  # tomllib says "(at line N, column M)"
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or exc
        context = getattr(exc, "context", None)
        raise ConfigError(f"{at}{problem}" + (f" ({context})" if context else "")) from exc
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping with 'models', 'servers' and/or 'teams'")
    _check_size(data)
    return data


# Far more than any team's file. YAML aliases let a few lines name a value that expands
# without bound once stored or shown (a "billion laughs"); it is refused before either.
MAX_VALUES = 100_000


def _check_size(data: dict) -> None:
    """Refuse a file whose values, each alias counted as what it expands to, pass MAX_VALUES."""
    stack: list[Any] = [data]
    for _ in range(MAX_VALUES):
        if not stack:
            return
        item = stack.pop()
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    if stack:
        raise ConfigError(
            f"the file holds more than {MAX_VALUES:,} values once its YAML aliases are"
            " expanded; write them out, or split the file"
        )


def _check_mapping(item: Any, allowed: set[str], path: str, parent: Any, index: int = 0) -> None:
    if not isinstance(item, dict):
        lines = getattr(parent, "item_lines", None)
        at = f" (line {lines[index]})" if lines else ""
        raise ConfigError(f"{path}{at}: expected a mapping, got {item!r}")
    unknown = sorted(set(item) - allowed, key=str)
    if unknown:
        raise ConfigError(
            f"{where(item, path, unknown[0])}: unknown keys {unknown}; allowed: {sorted(allowed)}"
        )


def _list(container: dict, key: str, path: str) -> list:
    value = container.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where(container, path, key)}: expected a list, got {value!r}")
    return value


def _name(item: dict, key: str, path: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where(item, path, key)}: {what} needs a {key} (a non-empty string)")
    return value


def _check_types(item: dict, path: str) -> None:
    """What the model fields cannot check themselves (JSON fields take anything)."""
    aliases = item.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{where(item, path, 'aliases')}: expected a list of names")
    if not isinstance(item.get("load_options", {}), dict):
        raise ConfigError(f"{where(item, path, 'load_options')}: expected a mapping")


def _field_values(obj: db.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _upsert(
    model_cls: type[db.Model],
    lookup: dict,
    values: dict,
    item: Any,
    path: str,
    summary: Summary,
    create_defaults: dict | None = None,
):
    """Create or update one row; only what the file says is written, and only if it differs."""
    obj = model_cls.objects.filter(**lookup).first()
    created = obj is None
    if created:
        obj = model_cls(**lookup, **(create_defaults or {}))
    before = None if created else _field_values(obj)
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):  # int() of it overflows
            raise ConfigError(f"{where(item, path, key)}: {value} is not a finite number")
        setattr(obj, key, value)
    try:
        # Cleaning also converts values ("8" → 8), so the comparison below sees real changes.
        obj.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        problems = [
            f"{where(item, path, None if key == '__all__' else key)}: {' '.join(msgs)}"
            for key, msgs in exc.message_dict.items()
        ]
        raise ConfigError("; ".join(problems)) from exc
    if created or _field_values(obj) != before:
        obj.save()
        (summary.created if created else summary.updated).append(
            f"{model_cls._meta.verbose_name} {obj}"
        )
    return obj


def _named(data: dict, key: str, allowed: set[str], noun: str) -> Iterator[tuple[str, dict, str]]:
    """Each entry of the top-level list `key`, checked: its path, itself and its name, which
    the file may give only once."""
    seen: dict[str, str] = {}
    items = _list(data, key, "")
    for i, item in enumerate(items):
        path = f"{key}[{i}]"
        _check_mapping(item, {*allowed, "name"}, path, items, i)
        name = _name(item, "name", path, f"a {noun}")
        if name in seen:
            raise ConfigError(f"{where(item, path, 'name')}: {noun} {name!r} is also {seen[name]}")
        seen[name] = path
        yield path, item, name


def _apply_models(data: dict, summary: Summary) -> dict[str, Model]:
    models: dict[str, Model] = {}
    located: dict[str, tuple[str, dict]] = {}
    for path, item, name in _named(data, "models", set(MODEL_FIELDS), "model"):
        located[name] = (path, item)
        _check_types(item, path)
        values = {k: v for k, v in item.items() if k != "name"}
        models[name] = _upsert(Model, {"name": name}, values, item, path, summary)
    _check_aliases(models, located)
    return models


def _check_aliases(models: dict[str, Model], located: dict[str, tuple[str, dict]]) -> None:
    """An alias may not be another model's name or alias: a request must mean one model."""
    owner: dict[str, str] = {}
    for other in Model.objects.order_by("name"):
        for public in other.names:
            owner.setdefault(public, other.name)
    for name, model in models.items():
        for alias in model.aliases:
            if owner.get(alias, name) != name:
                path, item = located[name]
                raise ConfigError(
                    f"{where(item, path, 'aliases')}: {alias!r} already names model "
                    f"{owner[alias]!r}"
                )


def _apply_deployments(
    server: Server, item: dict, path: str, models: dict[str, Model], summary: Summary
) -> set[str]:
    """The server's deployments as the file lists them; the names of their models."""
    deployments = _list(item, "deployments", path)
    seen: dict[str, str] = {}
    for j, dep in enumerate(deployments):
        dpath = f"{path}.deployments[{j}]"
        _check_mapping(dep, {*DEPLOYMENT_FIELDS, "model"}, dpath, deployments, j)
        name = _name(dep, "model", dpath, "a deployment")
        if name in seen:
            raise ConfigError(
                f"{where(dep, dpath, 'model')}: model {name!r} is deployed twice on "
                f"{server.name} (also {seen[name]})"
            )
        seen[name] = dpath
        model = models.get(name) or Model.objects.filter(name=name).first()
        if model is None:
            raise ConfigError(
                f"{where(dep, dpath, 'model')}: unknown model {name!r} "
                "(list it under 'models' or create it first)"
            )
        _check_types(dep, dpath)
        values = {k: v for k, v in dep.items() if k != "model"}
        _upsert(
            Deployment,
            {"server": server, "model": model},
            values,
            dep,
            dpath,
            summary,
            create_defaults={"server_model_id": model.name},
        )
    return set(seen)


def _apply_teams(data: dict, summary: Summary) -> None:
    """Teams by name with their share and quotas. Keys join a team in the admin or with
    `create_api_key --team`: a key's secret is never in a file, and its name is not unique."""
    for path, item, name in _named(data, "teams", set(TEAM_FIELDS), "team"):
        values = {k: v for k, v in item.items() if k != "name"}
        _upsert(Team, {"name": name}, values, item, path, summary)


def _shown(obj: db.Model, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields among `names` that differ from their defaults, as a file would say them."""
    found = {}
    for name in names:
        value = getattr(obj, name)
        if value != obj._meta.get_field(name).get_default():
            found[name] = value
    return found


def export() -> dict:
    """Every server, model, deployment and team as a file would say it: applying it changes
    nothing, and on an empty database makes the same rows. Fields at their defaults are left
    out; a server's API key is never in it (it is write-only)."""
    deployments = Deployment.objects.select_related("model").order_by("model__name")
    servers = Server.objects.order_by("name").prefetch_related(
        db.Prefetch("deployments", queryset=deployments)
    )
    return {
        "models": [
            {"name": m.name, **_shown(m, MODEL_FIELDS)} for m in Model.objects.order_by("name")
        ],
        "servers": [
            {
                "name": s.name,
                "kind": s.kind,
                **_shown(s, tuple(f for f in SERVER_FIELDS[1:] if f != "api_key")),
                "deployments": [
                    {
                        "model": d.model.name,
                        **_shown_id(d),
                        **_shown(d, DEPLOYMENT_FIELDS[1:]),
                    }
                    for d in s.deployments.all()
                ],
            }
            for s in servers
        ],
        "teams": [{"name": t.name, **_shown(t, TEAM_FIELDS)} for t in Team.objects.all()],
    }


def _shown_id(d: Deployment) -> dict[str, str]:
    """The server's own name for the model, left out where it is the default (the model's)."""
    return {} if d.server_model_id == d.model.name else {"server_model_id": d.server_model_id}


def _delete(rows: Iterable[db.Model], summary: Summary) -> None:
    for obj in rows:
        summary.deleted.append(f"{obj._meta.verbose_name} {obj}")
        obj.delete()


def _prune(data: dict, servers: dict[str, set[str] | None], summary: Summary) -> None:
    """Delete what the file leaves out, in each list it has: servers, models and teams it
    does not name, and on each server with a `deployments` list, deployments not in it. A
    list the file does not have is left alone. Deployments go before their model or server,
    each named."""
    leaving = db.Q(pk__in=[])
    for server, kept in servers.items():
        if kept is not None:
            leaving |= db.Q(server__name=server) & ~db.Q(model__name__in=kept)
    if "servers" in data:
        leaving |= ~db.Q(server__name__in=servers)
    if "models" in data:
        leaving |= ~db.Q(model__name__in=[item["name"] for item in data["models"]])
    deployments = Deployment.objects.select_related("model", "server").filter(leaving)
    _delete(deployments.order_by("server__name", "model__name"), summary)
    if "servers" in data:
        _delete(Server.objects.exclude(name__in=servers).order_by("name"), summary)
    if "models" in data:
        named = [item["name"] for item in data["models"]]
        _delete(Model.objects.exclude(name__in=named).order_by("name"), summary)
    if "teams" in data:
        named = [item["name"] for item in data["teams"]]
        for team in Team.objects.exclude(name__in=named).order_by("name"):
            if keys := team.keys.count():
                raise ConfigError(
                    f"teams: team {team.name!r} is not in the file but holds {keys} API"
                    " key(s); move them to another team (or none) first, or list the team"
                )
            _delete([team], summary)


@transaction.atomic
def apply(data: dict, prune: bool = False) -> Summary:
    """Create or update everything the file names; with `prune`, delete what its lists leave
    out too (`_prune`). Raises ConfigError and changes nothing."""
    summary = Summary()
    _check_mapping(data, TOP_KEYS, "", data)
    _apply_teams(data, summary)
    models = _apply_models(data, summary)
    servers: dict[str, set[str] | None] = {}  # each one's deployments, if it lists them
    for path, item, name in _named(data, "servers", {*SERVER_FIELDS, "deployments"}, "server"):
        values = {k: v for k, v in item.items() if k in SERVER_FIELDS}
        server = _upsert(Server, {"name": name}, values, item, path, summary)
        listed = _apply_deployments(server, item, path, models, summary)
        servers[name] = listed if "deployments" in item else None
    if prune:
        _prune(data, servers, summary)
    return summary

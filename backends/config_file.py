"""Declarative servers, models and deployments from a YAML or TOML file.

Applying a file creates or updates what it names and leaves everything else alone, so it is
safe to apply the same file again.
"""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction

from .models import Deployment, Model, Server

SERVER_FIELDS = {
    "kind",
    "base_url",
    "api_key",
    "enabled",
    "slots",
    "max_llm",
    "max_embedding",
    "max_reranking",
    "memory_mb",
}
MODEL_FIELDS = {"aliases", "type", "load_timeout_s", "load_options"}
DEPLOYMENT_FIELDS = {
    "server_model_id",
    "size_mb",
    "device",
    "load_options",
    "pinned",
    "preload",
    "idle_ttl_s",
}


class ConfigError(ValueError):
    pass


class _Mapping(dict):
    line: int | None = None


class _LineLoader(yaml.SafeLoader):
    """Remembers the line of each mapping so errors can point at it."""

    def construct_mapping(self, node, deep=False):
        mapping = _Mapping(super().construct_mapping(node, deep=deep))
        mapping.line = node.start_mark.line + 1
        return mapping


def where(item: Any, path: str) -> str:
    line = getattr(item, "line", None)
    return f"{path} (line {line})" if line else path


@dataclass
class Summary:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"created {len(self.created)}: {', '.join(self.created) or '-'}; "
            f"updated {len(self.updated)}: {', '.join(self.updated) or '-'}"
        )


def load_file(path: str | Path) -> dict:
    path = Path(path)
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{at} {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'models' and 'servers'")
    return data


def _check_keys(item: Any, allowed: set[str], path: str) -> None:
    if not isinstance(item, dict):
        raise ConfigError(f"{where(item, path)}: expected a mapping")
    unknown = set(item) - allowed
    if unknown:
        raise ConfigError(
            f"{where(item, path)}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}"
        )


def _save(obj, item: Any, path: str) -> None:
    try:
        obj.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
        raise ConfigError(f"{where(item, path)}: {problems}") from exc
    obj.save()


def _upsert(model_cls, lookup: dict, values: dict, item: Any, path: str, summary: Summary):
    obj = model_cls.objects.filter(**lookup).first()
    created = obj is None
    obj = obj or model_cls(**lookup)
    changed = created
    for key, value in values.items():
        if getattr(obj, key) != value:
            setattr(obj, key, value)
            changed = True
    if changed:
        _save(obj, item, path)
        (summary.created if created else summary.updated).append(str(obj))
    return obj


@transaction.atomic
def apply(data: dict) -> Summary:
    """Create or update everything the file names; raises ConfigError and changes nothing."""
    summary = Summary()
    _check_keys(data, {"models", "servers"}, "file")
    models: dict[str, Model] = {}
    for i, item in enumerate(data.get("models") or []):
        path = f"models[{i}]"
        _check_keys(item, MODEL_FIELDS | {"name"}, path)
        if "name" not in item:
            raise ConfigError(f"{where(item, path)}: a model needs a name")
        values = {k: v for k, v in item.items() if k != "name"}
        models[item["name"]] = _upsert(Model, {"name": item["name"]}, values, item, path, summary)
    for i, item in enumerate(data.get("servers") or []):
        path = f"servers[{i}]"
        _check_keys(item, SERVER_FIELDS | {"name", "deployments"}, path)
        if "name" not in item:
            raise ConfigError(f"{where(item, path)}: a server needs a name")
        values = {k: v for k, v in item.items() if k in SERVER_FIELDS}
        server = _upsert(Server, {"name": item["name"]}, values, item, path, summary)
        for j, dep in enumerate(item.get("deployments") or []):
            dpath = f"{path}.deployments[{j}]"
            _check_keys(dep, DEPLOYMENT_FIELDS | {"model"}, dpath)
            name = dep.get("model")
            model = models.get(name) or Model.objects.filter(name=name).first()
            if model is None:
                raise ConfigError(f"{where(dep, dpath)}: unknown model {name!r}")
            values = {k: v for k, v in dep.items() if k != "model"}
            values.setdefault("server_model_id", model.name)
            _upsert(Deployment, {"server": server, "model": model}, values, dep, dpath, summary)
    return summary

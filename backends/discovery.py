"""Create deployments for the models a server says it has.

Discovery only adds: an operator's models and deployments are never deleted or overwritten.
What it writes on an existing deployment are facts the operator left empty: its size, and
how many requests of it the server serves at once (its `slots`); and on a model, what it
takes besides text (its `capabilities`) and the tokens a request may use (its
`context_length`) where nobody has said so.
"""

from dataclasses import dataclass, field, replace

from asgiref.sync import async_to_sync
from django.db import transaction

from .adapters.base import Adapter, AdapterError, ServerModel
from .adapters.registry import adapter_for
from .models import Deployment, Model, ModelType, Server

NAME_MAX = Model._meta.get_field("name").max_length
FACTS = {"size_mb": "size", "slots": "slots"}  # what a listing may fill, as the report says


@dataclass
class SyncReport:
    server: str
    created_models: list[str] = field(default_factory=list)
    created_deployments: list[str] = field(default_factory=list)
    filled: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # Deployments whose name the server does not list: a typo in the configuration or a
    # model removed from the server. Loads of them fail.
    not_listed: list[str] = field(default_factory=list)
    listed: int = 0
    error: str = ""

    def __str__(self) -> str:
        if self.error:
            return f"{self.server}: could not list models ({self.error})"
        parts = [f"{self.server}: {self.listed} listed"]
        for label, names in (
            ("new deployments", self.created_deployments),
            ("new models", self.created_models),
            ("filled", self.filled),
            ("skipped", self.skipped),
            ("not listed by the server", self.not_listed),
        ):
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        if not (self.created_deployments or self.filled):
            parts.append("nothing new")
        return "; ".join(parts)


async def described(adapter: Adapter, only: str | None = None) -> list[ServerModel]:
    """What the server lists (`only`: that model of it), with what it says of its running
    models besides (slots, capabilities, context)."""
    listed = [m for m in await adapter.list_models() if only is None or m.id == only]
    facts = await adapter.model_facts(listed)
    return [replace(m, **facts.get(m.id, {})) for m in listed]


async def _list(server: Server, spelled: list[str]) -> list[ServerModel]:
    adapter = adapter_for(server)
    adapter.spell(spelled)
    try:
        return await described(adapter)
    finally:
        await adapter.close()


def listed_models(server: Server) -> list[ServerModel]:
    """What the server lists right now, named as its deployments name them (raises
    AdapterError or ValueError for unknown kinds)."""
    spelled = list(server.deployments.values_list("server_model_id", flat=True))
    return async_to_sync(_list)(server, spelled)


def _public_names() -> dict[str, Model]:
    """Every name apps can use for a model (its name and aliases) → the model."""
    models = list(Model.objects.all())
    names = {alias: model for model in models for alias in model.aliases or []}
    # A model's own name wins over another model's alias.
    names.update({model.name: model for model in models})
    return names


def _model_type(listed: ServerModel) -> str:
    return listed.type if listed.type in ModelType.values else ModelType.LLM


def fill_empty_facts(deployment_id: int, item: ServerModel) -> list[str]:
    """After a load: what the server says of the model now running, where nobody has said
    it (its slots, size, capabilities, context), as discovery fills them; what it filled."""
    d = Deployment.objects.select_related("model", "server").get(pk=deployment_id)
    report = SyncReport(d.server.name)
    _fill_facts(d, item, report)
    return report.filled


def _fill_facts(d: Deployment, item: ServerModel, report: SyncReport) -> None:
    _fill_model_facts(d.model, item, report)
    facts = {"size_mb": item.size_mb, "slots": item.slots}
    empty = [n for n, value in facts.items() if value and getattr(d, n) is None]
    if empty:
        for name in empty:
            setattr(d, name, facts[name])
        d.save(update_fields=empty)
        report.filled.append(f"{d} ({', '.join(FACTS[name] for name in empty)})")


def _fill_model_facts(model: Model, listed: ServerModel, report: SyncReport) -> None:
    """A model's capabilities and context length, when nobody has said them yet, as the
    first server that says them does (an operator's value, even an empty list, stays)."""
    filled = []
    if model.capabilities is None and listed.capabilities is not None and model.type == "llm":
        model.capabilities = list(listed.capabilities)
        filled.append(("capabilities", ", ".join(model.capabilities) or "none"))
    if model.context_length is None and listed.context_length is not None:
        model.context_length = listed.context_length
        filled.append(("context_length", str(model.context_length)))
    if filled:
        model.save(update_fields=[name for name, _ in filled])
        said = "; ".join(f"{name}: {value}" for name, value in filled)
        report.filled.append(f"{model.name} ({said})")


@transaction.atomic
def record(server: Server, listed: list[ServerModel], report: SyncReport) -> None:
    """Add what is missing for `listed` on `server`; fill only empty facts on what exists."""
    report.listed = len(listed)
    known = {d.server_model_id: d for d in server.deployments.select_related("model")}
    deployed = {d.model_id for d in known.values()}
    public = _public_names()
    for item in listed:
        existing = known.get(item.id)
        if existing is not None:
            _fill_facts(existing, item, report)
            continue
        if len(item.id) > NAME_MAX:
            report.skipped.append(f"{item.id[:40]}… (name longer than {NAME_MAX} characters)")
            continue
        model = public.get(item.id)
        if model is None:
            model = Model.objects.create(name=item.id, type=_model_type(item))
            public[model.name] = model
            report.created_models.append(model.name)
        elif model.pk in deployed:
            # The operator already put this model on this server under another server name.
            report.skipped.append(f"{item.id} ({model.name} is already deployed here)")
            continue
        _fill_model_facts(model, item, report)
        deployment = Deployment.objects.create(
            server=server,
            model=model,
            server_model_id=item.id,
            size_mb=item.size_mb,
            slots=item.slots,
        )
        known[item.id] = deployment
        deployed.add(model.pk)
        report.created_deployments.append(str(deployment))
    if server.is_simulated:
        return  # it lists what is loaded in the worker's process, not what it has
    names = {item.id for item in listed}
    report.not_listed = sorted(
        f"{d} ({d.server_model_id})" for d in known.values() if d.server_model_id not in names
    )


def sync_server(server: Server) -> SyncReport:
    """Ask the server what it has and add what Switchyard does not know yet."""
    report = SyncReport(server=server.name)
    try:
        listed = listed_models(server)
    except AdapterError as exc:
        report.error = exc.message
        return report
    except ValueError as exc:
        report.error = str(exc)
        return report
    record(server, listed, report)
    return report

"""Is a server set up as Switchyard needs it? `manage.py check_servers`, the admin's *Check
server set-up* action and `GET /api/v1/servers/{name}/check` ask each server and say, line by
line, what is right and what is not:

- whether it answers, and which kind of server it answers as (`identify`: read-only GETs
  that each kind answers in a way of its own), against the kind configured: a server set up
  as `openai` that is LM Studio or Ollama works, but Switchyard cannot load or unload there;
- whether it lists every deployment's `server_model_id` (a typo makes every load fail), and
  how many of the models it lists Switchyard does not know (`sync_models` adds them);
- whether a deployment's `slots` agree with what the server says of them, whether the
  server runs a model with less context than apps are told it has, and whether a
  llama-server router runs as many models at once as Switchyard may keep there;
- whether a deployment has load options its server kind does not apply.

It changes nothing."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from asgiref.sync import async_to_sync

from .adapters.base import AdapterError, ServerModel, positive_count
from .adapters.registry import takes_load_options
from .discovery import listed_models
from .models import Server, ServerKind

PROBE_TIMEOUT_S = 5.0
CONTROLLED = {k for k in ServerKind.values if k not in (ServerKind.OPENAI, ServerKind.SIMULATED)}
OK, WARN, ERROR = "ok", "warning", "error"
MARKS = {OK: "✓", WARN: "!", ERROR: "✗"}


@dataclass
class Finding:
    level: str
    text: str


@dataclass
class Checkup:
    server: str
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: str, text: str) -> None:
        self.findings.append(Finding(level, text))

    @property
    def worst(self) -> str:
        levels = {f.level for f in self.findings}
        return ERROR if ERROR in levels else WARN if WARN in levels else OK

    def __str__(self) -> str:
        lines = [f"{self.server}: {self.worst}"]
        return "\n".join(lines + [f"  {MARKS[f.level]} {f.text}" for f in self.findings])


async def _json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON a GET of `path` answers with 200, else None."""
    try:
        answer = await client.get(path)
        return answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _lmstudio(body: Any) -> bool:
    # What `lms` and LM Studio's SDK probe: LM Studio answers 200 to any path, so a 200
    # alone proves nothing.
    return body == {"lmstudio": True}


def _llamaswap(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("running"), list)


def _lemonade(body: Any) -> bool:
    return isinstance(body, dict) and ("all_models_loaded" in body or "model_loaded" in body)


def _llamacpp(body: Any) -> bool:
    return isinstance(body, dict) and (
        "default_generation_settings" in body or body.get("role") == "router"
    )


def _vllm(body: Any) -> bool:
    data = body.get("data") if isinstance(body, dict) else None
    return bool(data) and all(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in data)


def _openai(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("data"), list)


# After Ollama (told by its `GET /` text), in this order: the first whose path answers as
# it says names the kind (llama-swap before llama.cpp, whose servers it may run; any
# OpenAI-compatible server last). Each path is asked once.
PROBES: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    (ServerKind.LMSTUDIO, "/lmstudio-greeting", _lmstudio),
    (ServerKind.LLAMASWAP, "/running", _llamaswap),
    (ServerKind.LEMONADE, "/api/v1/health", _lemonade),
    (ServerKind.LLAMACPP, "/props", _llamacpp),
    (ServerKind.VLLM, "/v1/models", _vllm),
    (ServerKind.OPENAI, "/v1/models", _openai),
)


@dataclass
class Identified:
    kind: str | None  # None: nothing answers, or not as any kind Switchyard knows
    said: dict[str, Any] = field(default_factory=dict)  # what each path asked answered


async def _identify(base_url: str, api_key: str) -> Identified:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    found = Identified(None)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=PROBE_TIMEOUT_S
    ) as client:
        try:
            root = await client.get("/")
        except httpx.TransportError:
            return found  # nothing answers there: each probe would wait its timeout for it
        if root.text.strip() == "Ollama is running":
            found.kind = ServerKind.OLLAMA
            return found
        for kind, path, answers_as in PROBES:
            if path not in found.said:
                found.said[path] = await _json(client, path)
            if answers_as(found.said[path]):
                found.kind = kind
                return found
    return found


def identify(server: Server) -> Identified:
    """Which kind of server answers at the server's address, and what it said."""
    return async_to_sync(_identify)(server.base_url.rstrip("/"), server.api_key)


def router_room(props: Any) -> int | None:
    """How many models a llama-server router runs at once (`--models-max`, as its `/props`
    says it); None for no limit, or for a server that is no router."""
    if not isinstance(props, dict) or props.get("role") != "router":
        return None
    return positive_count(props.get("max_instances"))


def room_held(server: Server) -> int:
    """How many models Switchyard may keep loaded there at once: its room for each type it
    has a deployment of, at most its `max_models`."""
    types = set(server.deployments.values_list("model__type", flat=True))
    held = sum(n for kind, n in server.room.items() if kind in types) or server.max_llm
    return min(held, server.max_models or held)


def check_server(server: Server) -> Checkup:
    report = Checkup(server.name)
    if server.is_simulated:
        report.add(OK, "simulated: an in-process stand-in, nothing to ask")
        return report
    if not server.enabled:
        report.add(WARN, "disabled: Switchyard sends it nothing")
    _check_kind(server, report)
    try:
        listed = listed_models(server)
    except AdapterError as error:
        report.add(ERROR, f"cannot list its models (kind {server.kind}): {error.message}")
        return report
    _check_models(server, listed, report)
    return report


def _check_kind(server: Server, report: Checkup) -> None:
    identified = identify(server)
    found = identified.kind
    if found is None:
        report.add(ERROR, f"nothing at {server.base_url} answers as a server Switchyard knows")
    elif found == server.kind:
        report.add(OK, f"answers at {server.base_url} as {found}")
        if found == ServerKind.LLAMACPP:
            _check_router_room(server, router_room(identified.said.get("/props")), report)
    elif server.kind == ServerKind.OPENAI and found in CONTROLLED:
        report.add(
            WARN,
            f"answers as {found}, set up as openai: Switchyard cannot load or unload models"
            f" there; with kind {found} it can",
        )
    elif found == ServerKind.OPENAI:
        report.add(
            WARN,
            f"answers as an OpenAI-compatible server only, set up as {server.kind}: loads and"
            " unloads there may fail",
        )
    else:
        report.add(ERROR, f"answers as {found}, set up as {server.kind}: set kind {found}")


def too_little_room(server: Server, room: int | None) -> str | None:
    """What is wrong when a router runs fewer models at once than Switchyard may keep
    there; None when it is not (also for no limit, or a server that is no router)."""
    held = room_held(server)
    if room is None or room >= held:
        return None
    return (
        f"the router runs at most {room} model{'' if room == 1 else 's'} at once"
        " (--models-max) and stops the"
        f" least recently used by itself beyond that, but Switchyard may keep {held}"
        f" there (max LLMs and the room for each other type deployed): set max models in"
        f" all to {room} (a worker does as it reaches the server), or start the router with"
        f" --models-max {held} (0: no limit)"
    )


def _check_router_room(server: Server, room: int | None, report: Checkup) -> None:
    if (wrong := too_little_room(server, room)) is not None:
        report.add(WARN, wrong)


def _check_models(server: Server, listed: list[ServerModel], report: Checkup) -> None:
    by_id = {m.id: m for m in listed}
    deployments = list(server.deployments.select_related("model").order_by("model__name"))
    missing = [d for d in deployments if d.server_model_id not in by_id]
    report.add(
        ERROR if missing else OK,
        f"lists {len(listed)} models; {len(deployments) - len(missing)} of its"
        f" {len(deployments)} deployments among them",
    )
    for d in missing:
        report.add(
            ERROR,
            f"{d.model.name}: the server lists no {d.server_model_id!r} (a typo, or a model"
            " removed from the server): its loads fail",
        )
    known = {d.server_model_id for d in deployments}
    if unknown := [m.id for m in listed if m.id not in known]:
        report.add(
            OK,
            f"{len(unknown)} models it lists have no deployment here (`sync_models"
            f" {server.name}` adds them): {', '.join(sorted(unknown)[:5])}"
            + (" …" if len(unknown) > 5 else ""),
        )
    for d in deployments:
        if d.load_options and not takes_load_options(server.kind):
            report.add(
                WARN,
                f"{d.model.name}: its load options ({', '.join(sorted(d.load_options))}) are"
                f" not applied: a {server.kind} server takes none (set them in its own"
                " configuration: a router's preset, llama-swap's cmd)",
            )
        said = by_id.get(d.server_model_id)
        if said is not None and said.slots and d.slots and said.slots != d.slots:
            report.add(
                WARN,
                f"{d.model.name}: slots {d.slots} here, the server serves {said.slots} at once",
            )
        told = d.model.context_length
        if said is not None and said.context_length and told and said.context_length < told:
            report.add(
                WARN,
                f"{d.model.name}: apps are told its context is {told} tokens, the server runs"
                f" it with {said.context_length}: longer requests fail there (lower the"
                " model's context_length, or load it with more context)",
            )

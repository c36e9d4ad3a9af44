"""Is a server set up as Switchyard needs it? `manage.py check_servers`, the admin's *Check
server set-up* action and `GET /api/v1/servers/{name}/check` ask each server and say, line by
line, what is right and what is not:

- whether it answers, and which kind of server it answers as (`identify`: read-only GETs
  that each kind answers in a way of its own), against the kind configured: a server set up
  as `openai` that is LM Studio or Ollama works, but Switchyard cannot load or unload there;
- whether it lists every deployment's `server_model_id` (a typo makes every load fail), and
  how many of the models it lists Switchyard does not know (`sync_models` adds them);
- whether a deployment's `slots` agree with what the server says of them, and whether a
  llama-server router runs as many models at once as Switchyard may keep there.

It changes nothing."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from asgiref.sync import async_to_sync

from .adapters.base import AdapterError, ServerModel
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


Probe = Callable[[httpx.AsyncClient], Awaitable[bool]]


async def _json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON a GET of `path` answers with 200, else None."""
    try:
        answer = await client.get(path)
        return answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def _lmstudio(client: httpx.AsyncClient) -> bool:
    # What `lms` and LM Studio's SDK probe: LM Studio answers 200 to any path, so a 200
    # alone proves nothing.
    return (await _json(client, "/lmstudio-greeting") or {}) == {"lmstudio": True}


async def _ollama(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/")).text.strip() == "Ollama is running"
    except httpx.HTTPError:
        return False


async def _llamaswap(client: httpx.AsyncClient) -> bool:
    body = await _json(client, "/running")
    return isinstance(body, dict) and isinstance(body.get("running"), list)


async def _lemonade(client: httpx.AsyncClient) -> bool:
    body = await _json(client, "/api/v1/health")
    return isinstance(body, dict) and ("all_models_loaded" in body or "model_loaded" in body)


async def _llamacpp(client: httpx.AsyncClient) -> bool:
    body = await _json(client, "/props")
    return isinstance(body, dict) and (
        "default_generation_settings" in body or body.get("role") == "router"
    )


async def _vllm(client: httpx.AsyncClient) -> bool:
    body = await _json(client, "/v1/models")
    data = body.get("data") if isinstance(body, dict) else None
    return bool(data) and all(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in data)


async def _openai(client: httpx.AsyncClient) -> bool:
    body = await _json(client, "/v1/models")
    return isinstance(body, dict) and isinstance(body.get("data"), list)


# In this order: the first that says yes names the kind (llama-swap before llama.cpp, whose
# servers it may run; any OpenAI-compatible server last).
PROBES: tuple[tuple[str, Probe], ...] = (
    (ServerKind.LMSTUDIO, _lmstudio),
    (ServerKind.OLLAMA, _ollama),
    (ServerKind.LLAMASWAP, _llamaswap),
    (ServerKind.LEMONADE, _lemonade),
    (ServerKind.LLAMACPP, _llamacpp),
    (ServerKind.VLLM, _vllm),
    (ServerKind.OPENAI, _openai),
)


async def _identify(base_url: str, api_key: str) -> str | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=PROBE_TIMEOUT_S
    ) as client:
        try:
            await client.get("/")
        except httpx.TransportError:
            return None  # nothing answers there: each probe would wait its timeout for it
        for kind, probe in PROBES:
            if await probe(client):
                return kind
    return None


def identify(server: Server) -> str | None:
    """The kind of server that answers at the server's address; None if none answers as
    any kind Switchyard knows (or nothing answers)."""
    return async_to_sync(_identify)(server.base_url.rstrip("/"), server.api_key)


def router_room(server: Server) -> int | None:
    """How many models a llama-server router runs at once (`--models-max`, as its `/props`
    says it); None for no limit, or for any other server."""
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    try:
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=PROBE_TIMEOUT_S) as c:
            props = c.get("/props").json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(props, dict) or props.get("role") != "router":
        return None
    room = props.get("max_instances")
    return room if isinstance(room, int) and room > 0 else None


def room_held(server: Server) -> int:
    """How many models Switchyard may keep loaded there at once: its room for each type it
    has a deployment of."""
    types = set(server.deployments.values_list("model__type", flat=True))
    room = {"llm": server.max_llm, "embedding": server.max_embedding}
    room["reranking"] = server.max_reranking
    return sum(n for kind, n in room.items() if kind in types) or server.max_llm


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
        report.add(ERROR, f"cannot list its models as a {server.kind} server: {error.message}")
        return report
    _check_models(server, listed, report)
    return report


def _check_kind(server: Server, report: Checkup) -> None:
    found = identify(server)
    if found is None:
        report.add(ERROR, f"nothing at {server.base_url} answers as a server Switchyard knows")
    elif found == server.kind:
        report.add(OK, f"answers at {server.base_url} as {found}")
        if found == ServerKind.LLAMACPP:
            _check_router_room(server, report)
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


def _check_router_room(server: Server, report: Checkup) -> None:
    room, held = router_room(server), room_held(server)
    if room is not None and room < held:
        report.add(
            WARN,
            f"the router runs at most {room} models at once (--models-max) and stops the"
            f" least recently used by itself beyond that, but Switchyard may keep {held}"
            f" there (max LLMs and the room for each other type deployed): lower them to"
            f" {room} in all, or start the router with --models-max {held} (0: no limit)",
        )


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
        said = by_id.get(d.server_model_id)
        if said is not None and said.slots and d.slots and said.slots != d.slots:
            report.add(
                WARN,
                f"{d.model.name}: slots {d.slots} here, the server serves {said.slots} at once",
            )

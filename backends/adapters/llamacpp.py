"""llama.cpp `llama-server`, in either of its modes (told apart by its model listing).

Single-model mode: the model is fixed at start. `loading` while `/health` answers 503,
`sleeping` when `/props` says so (the next request wakes it, so `load` has nothing to do),
and it cannot unload.

Router mode (started without `-m`): `POST /models/load` returns at once, so `load` listens
on `/models/sse` for the model's status and load progress (stages × fraction). The real
router (b11434) names only the first event of a load `model_status`; progress, `loaded`,
`unloaded` (and a failed load: `unloaded` with exit code 1) all come as `status_change`.
Inference is sent with `?autoload=false`, so a request never starts a load: an unloaded
model answers "model is not loaded". The router takes no per-load options; context size and
the like are the model's preset arguments on the server. Started with `--slot-save-path`, its
models' prompt caches are saved before Switchyard unloads them and restored when they are
loaded again (`llamacpp_slots`).
"""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from .base import (
    CAPABILITIES,
    Activity,
    AdapterError,
    ErrorCode,
    LoadTarget,
    ProgressCallback,
    ServerModel,
    positive_count,
)
from .http import COUNT_TOKENS_PATHS, HttpAdapter
from .llamacpp_slots import PromptCaches

ROUTER_STATES = {"loaded": "loaded", "loading": "loading", "downloading": "loading"}
STATUS_EVENTS = ("model_status", "status_change")
UNLOAD_WAIT_S = 60.0


def router_state(entry: dict[str, Any]) -> str:
    value = (entry.get("status") or {}).get("value")
    if value == "sleeping":
        return "sleeping"
    return ROUTER_STATES.get(value, "unloaded")  # unknown values: not loaded


def load_fraction(progress: dict[str, Any]) -> float | None:
    """Overall fraction from `{"stages": [...], "current": "...", "value": 0..1}`."""
    stages = progress.get("stages") or []
    value = progress.get("value")
    if value is None:
        return None
    if progress.get("current") in stages:
        return (stages.index(progress["current"]) + float(value)) / len(stages)
    return float(value)


def model_type(entry: dict[str, Any]) -> str:
    """A router model started with `--embeddings` (a preset's `embeddings = true`) serves
    only embeddings; one started with `--reranking` (`reranking = true`) only reranks."""
    args = (entry.get("status") or {}).get("args") or []
    if "--reranking" in args or "--rerank" in args:
        return "reranking"
    return "embedding" if "--embeddings" in args or "--embedding" in args else "llm"


def size_mb(entry: dict[str, Any]) -> int | None:
    size = positive_count((entry.get("meta") or {}).get("size"))  # bytes; once it is loaded
    return round(size / 2**20) if size else None


def total_slots(props: dict[str, Any]) -> int | None:
    """The slots (`--parallel`) a model's `/props` says it has."""
    return positive_count(props.get("total_slots"))


def template_capabilities(props: dict[str, Any]) -> tuple[str, ...] | None:
    """Tools, as its chat template takes them (`chat_template_caps`), and images, as its
    projector does (`modalities`); llama-server says nothing of thinking. None for a build
    that says neither."""
    caps, modalities = props.get("chat_template_caps"), props.get("modalities")
    if not isinstance(caps, dict) or not isinstance(modalities, dict):
        return None
    found = {"tools": caps.get("supports_tools"), "vision": modalities.get("vision")}
    return tuple(name for name in CAPABILITIES if found.get(name))


def loaded_context(props: dict[str, Any]) -> int | None:
    """The context a slot runs with (`default_generation_settings.n_ctx`); a router's own
    `/props` says 0."""
    settings = props.get("default_generation_settings")
    return positive_count(settings.get("n_ctx") if isinstance(settings, dict) else None)


def props_facts(props: Any) -> dict[str, Any]:
    """What a model's `/props` says that a listing does not: its slots, capabilities and
    context."""
    if not isinstance(props, dict):
        return {}
    facts = {
        "slots": total_slots(props),
        "capabilities": template_capabilities(props),
        "context_length": loaded_context(props),
    }
    return {name: value for name, value in facts.items() if value is not None}


class LlamaCppAdapter(HttpAdapter):
    # Router mode: `POST /models/unload` of a model still `loading` stops its load (it is
    # listed `unloaded`, `failed: true`, as a failed load is). A single-model server never
    # loads a model for us, so no load of ours there is ever stopped.
    stops_loads = True
    tells_activity = True
    takes_load_options = False  # the model's arguments are set on the server
    # llama-server (b11434) closes the connection after a streamed answer, and its router
    # after every answer it relays from a model's process, without `Connection: close` when
    # asked for keep-alive: calls one at a time failed every other time on the pooled one.
    connection_per_call = True
    inference_paths = COUNT_TOKENS_PATHS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.router: bool | None = None  # learnt from the first listing
        self.listed: list[dict[str, Any]] = []  # the last listing a single-model server gave
        self.prompt_caches = PromptCaches()  # router mode, with --slot-save-path

    async def entries(self) -> list[dict[str, Any]]:
        try:
            body = await self.json("GET", "/v1/models")
        except AdapterError as error:
            # A single-model server answers 503 "Loading model" on every route, its listing
            # too, while its model loads (after a start or a restart): it still has the model
            # it listed before.
            if error.code == ErrorCode.BUSY and self.router is False and self.listed:
                return self.listed
            raise
        data = body.get("data", [])
        self.router = any("status" in entry for entry in data)
        if not self.router:
            self.listed = data
        return data

    async def list_models(self) -> list[ServerModel]:
        data = await self.entries()
        if self.router:
            return [ServerModel(e["id"], router_state(e), model_type(e), size_mb(e)) for e in data]
        state, props = await self.single_state()
        facts = props_facts(props)
        return [ServerModel(e["id"], state, size_mb=size_mb(e), **facts) for e in data]

    async def single_state(self) -> tuple[str, dict[str, Any] | None]:
        """Its model's state, and its `/props` (None while loading)."""
        try:
            await self.request("GET", "/health")
        except AdapterError as error:
            if error.code == ErrorCode.BUSY:  # 503 "Loading model"
                return "loading", None
            raise
        props = await self.json("GET", "/props")
        return ("sleeping" if props.get("is_sleeping") else "loaded"), props

    async def model_facts(self, listed: list[ServerModel]) -> dict[str, dict[str, Any]]:
        """In router mode, each running model's slots and capabilities, from its own
        `/props` (a model not running has no instance to say them); a single-model server's
        come with its list."""
        if not self.router:
            return {}
        found = {}
        for m in listed:
            if m.state != "loaded":
                continue
            try:
                props = await self.json("GET", "/props", params={"model": m.id})
            except AdapterError:
                continue
            if facts := props_facts(props):
                found[m.id] = facts
        return found

    async def activity(self, server_model_id: str) -> Activity | None:
        """From `/slots` (the router answers for a running model given as `?model=`): the
        slots processing now, and the last task id any slot took, which a slot keeps once
        done; None where slots are off (`--no-slots`) or it cannot say."""
        params = {"model": server_model_id} if self.router else None
        try:
            slots = await self.json("GET", "/slots", params=params)
        except AdapterError:
            return None
        if not isinstance(slots, list):
            return None
        slots = [s for s in slots if isinstance(s, dict)]
        tasks = [s["id_task"] for s in slots if isinstance(s.get("id_task"), int)]
        return Activity(sum(1 for s in slots if s.get("is_processing")), max(tasks, default=-1))

    async def find(self, server_model_id: str) -> dict[str, Any]:
        for entry in await self.entries():
            if server_model_id == entry["id"] or server_model_id in (entry.get("aliases") or []):
                return entry
        raise AdapterError(ErrorCode.NOT_FOUND, f"llama-server has no model {server_model_id}")

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        try:
            entry = await self.find(target.server_model_id)
        except AdapterError as error:
            if error.code != ErrorCode.BUSY:
                raise
            # A single-model server not yet listed by this worker, still loading its model.
            await self.wait_until(
                self.single_ready, "the model to finish loading", target.timeout_s
            )
            entry = await self.find(target.server_model_id)
        if not self.router:
            await self.wait_until(
                self.single_ready, "the model to finish loading", target.timeout_s
            )
            return
        if router_state(entry) in ("loaded", "sleeping"):  # a sleeping model wakes on use
            return
        async with self.open_stream("GET", "/models/sse", timeout=target.timeout_s) as events:
            if router_state(entry) != "loading":
                await self.start_router_load(target.server_model_id)
            # The stream tells only what happens after it opened: a load started by someone
            # else may have ended before (a tiny model loads in a fraction of a second).
            if router_state(await self.find(entry["id"])) in ("loaded", "sleeping"):
                progress(1.0)
            else:
                await self.follow_load(events, entry["id"], progress)
        await self.prompt_caches.restore(self, entry["id"])

    async def single_ready(self) -> bool:
        state, _ = await self.single_state()
        return state != "loading"

    async def start_router_load(self, server_model_id: str) -> None:
        try:
            await self.json("POST", "/models/load", json={"model": server_model_id})
        except AdapterError as error:
            # Someone else started it meanwhile: follow that load instead.
            if error.code != ErrorCode.BAD_REQUEST or "already" not in error.message:
                raise

    async def statuses(self, events, model_id: str) -> AsyncIterator[dict[str, Any]]:
        """The `data` of each status event about `model_id` on `/models/sse`."""
        async for _, data in self.sse_messages(events):
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if event.get("model") == model_id and event.get("event") in STATUS_EVENTS:
                yield event.get("data") or {}

    async def follow_load(self, events, model_id: str, progress: ProgressCallback) -> None:
        async for status in self.statuses(events, model_id):
            if status.get("status") == "loading" and status.get("progress"):
                fraction = load_fraction(status["progress"])
                if fraction is not None:
                    progress(fraction)
            elif status.get("status") in ("loaded", "sleeping"):
                progress(1.0)
                return
            elif status.get("status") == "unloaded":
                raise await self.load_failure(model_id)
        raise AdapterError(ErrorCode.CONNECTION, "/models/sse ended during the load")

    async def load_failure(self, model_id: str) -> AdapterError:
        status = (await self.find(model_id)).get("status") or {}
        return AdapterError(
            ErrorCode.LOAD_FAILED,
            f"llama-server could not load {model_id} (exit code {status.get('exit_code')})",
        )

    async def unload(self, server_model_id: str) -> None:
        entry = await self.find(server_model_id)
        model_id = entry["id"]
        if not self.router:
            raise AdapterError(
                ErrorCode.BAD_REQUEST, "a single-model llama-server cannot unload its model"
            )
        if router_state(entry) == "loaded":
            await self.prompt_caches.save(self, model_id)
        # The unload call returns at once; the child exits after its requests end (at most
        # the preset's stop-timeout). Its `unloaded` event says when, without polling.
        async with self.open_stream("GET", "/models/sse", timeout=UNLOAD_WAIT_S) as events:
            try:
                await self.json("POST", "/models/unload", json={"model": model_id})
            except AdapterError as error:
                if "not running" not in error.message:
                    raise
                return
            if router_state(await self.find(model_id)) == "unloaded":
                return
            try:
                async with asyncio.timeout(UNLOAD_WAIT_S):
                    async for status in self.statuses(events, model_id):
                        if status.get("status") == "unloaded":
                            return
            except TimeoutError:
                raise AdapterError(
                    ErrorCode.SERVER_ERROR, f"gave up waiting: {model_id} to unload"
                ) from None
        raise AdapterError(ErrorCode.CONNECTION, "/models/sse ended during the unload")

    def inference_params(self) -> dict[str, str] | None:
        return {"autoload": "false"} if self.router else None

    async def room(self) -> int | None:
        if self.router is None:
            await self.entries()
        if not self.router:
            return None
        props = await self.json("GET", "/props")
        if not isinstance(props, dict) or props.get("role") != "router":
            return None
        return positive_count(props.get("max_instances"))

    async def before_inference(self, call) -> None:
        if self.router is None:
            await self.entries()

    async def health(self) -> None:
        try:
            await self.request("GET", "/health")
        except AdapterError as error:
            if error.code != ErrorCode.BUSY:  # 503 while loading: up, just busy
                raise

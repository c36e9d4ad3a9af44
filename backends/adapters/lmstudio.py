"""LM Studio (0.4+ native REST API; 0.3.x listing as a fallback).

LM Studio reports load progress over HTTP only in the stream of its native chat,
`POST /api/v1/chat` (`model_load.progress` events). So an LLM loads through a one-token chat
stream whose progress is passed on, unless that would cost something:
- the chat is a JIT load, and LM Studio's auto-evict keeps one JIT model at a time: when the
  server may hold several LLMs, a chat load could unload one Switchyard keeps;
- the chat takes `context_length` but none of the engine options.
Then, and for embedding models, the load goes through `POST /api/v1/models/load`, a *manual*
load that blocks and reports nothing (progress is estimated). The load option `load_via`
(`chat` or `manual`) overrides the choice. A server with JIT loading off refuses the chat;
the manual load follows.

Inference is refused with `not_loaded` when the model is not resident, so LM Studio's JIT
loading never starts a load behind the scheduler's back.
"""

import json
from typing import Any

import httpx

from .base import (
    CAPABILITIES,
    AdapterError,
    ErrorCode,
    InferenceCall,
    LoadTarget,
    ProgressCallback,
    ServerModel,
    positive_count,
)
from .http import OPENAI_PATHS, HttpAdapter
from .http_errors import classify

# Load fields of `POST /api/v1/models/load`; the engine-specific ones only apply to LLMs.
LLM_LOAD_FIELDS = ("eval_batch_size", "flash_attention", "num_experts", "offload_kv_cache_to_gpu")
V0_TYPES = {"llm": "llm", "vlm": "llm", "embeddings": "embedding"}
# Status for the `type` of an `error` event in the native chat stream, for `classify`.
CHAT_ERROR_STATUS = {"invalid_request": 400, "model_not_found": 404}


def v1_capabilities(said: Any) -> tuple[str, ...] | None:
    """An LLM's `capabilities` in the 0.4 listing (`vision`, `trained_for_tool_use`,
    `reasoning`); None where it has none (embedding models)."""
    if not isinstance(said, dict):
        return None
    found = {"tools": said.get("trained_for_tool_use"), "vision": said.get("vision")}
    found["thinking"] = said.get("reasoning")
    return tuple(name for name in CAPABILITIES if found[name])


def v0_capabilities(entry: dict[str, Any]) -> tuple[str, ...] | None:
    """0.3.x says images by the type `vlm` and tools by `capabilities: ["tool_use"]` (from
    0.3.16); an older entry that says neither says nothing."""
    said = entry.get("capabilities")
    if entry.get("type") != "vlm" and not isinstance(said, list):
        return None
    tools = isinstance(said, list) and "tool_use" in said
    return (("tools",) if tools else ()) + (("vision",) if entry.get("type") == "vlm" else ())


class LMStudioAdapter(HttpAdapter):
    # Its OpenAI routes have no rerank: a rerank is refused here (`bad_request`), not sent.
    inference_paths = {k: v for k, v in OPENAI_PATHS.items() if k != "rerank"}

    def __init__(self, *args: Any, single_llm: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.single_llm = single_llm  # the server holds one LLM: JIT auto-evict costs nothing

    @classmethod
    def server_options(cls, server) -> dict[str, Any]:
        return {"single_llm": server.max_llm == 1}

    async def list_models(self) -> list[ServerModel]:
        return self.with_loading([model for model, _ in await self.listing()])

    async def listing(self) -> list[tuple[ServerModel, list[str]]]:
        """Every model with the ids of its loaded instances."""
        response = await self.request("GET", "/api/v1/models")
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "models" not in body:
            # 0.3.x answers 200 on unknown routes; its listing lives under /api/v0.
            return await self.listing_v0()
        found = []
        for m in body["models"]:
            loaded = m.get("loaded_instances") or []
            instances = [i["id"] for i in loaded]
            size = m.get("size_bytes")
            model = ServerModel(
                id=m["key"],
                state="loaded" if instances else "unloaded",
                type="embedding" if m.get("type") == "embedding" else "llm",
                size_mb=size // 2**20 if size else None,
                slots=parallel(loaded),
                capabilities=v1_capabilities(m.get("capabilities")),
                context_length=positive_count(loaded_config(loaded).get("context_length")),
            )
            found.append((model, instances))
        return found

    async def listing_v0(self) -> list[tuple[ServerModel, list[str]]]:
        body = await self.json("GET", "/api/v0/models")
        found = []
        for m in body.get("data", []):
            loaded = m.get("state") == "loaded"
            model = ServerModel(
                id=m["id"],
                state="loaded" if loaded else "unloaded",
                type=V0_TYPES.get(m.get("type"), "llm"),
                capabilities=v0_capabilities(m),
                context_length=positive_count(m.get("loaded_context_length")),
            )
            found.append((model, [m["id"]] if loaded else []))
        return found

    async def instances_of(self, server_model_id: str) -> list[str] | None:
        """Loaded instance ids of a model key (or of an instance id); None if unknown."""
        for model, instances in await self.listing():
            if model.id == server_model_id:
                return instances
            if server_model_id in instances:
                return [server_model_id]
        return None

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        instances = await self.instances_of(target.server_model_id)
        if instances is None:
            raise AdapterError(
                ErrorCode.NOT_FOUND, f"LM Studio has no model {target.server_model_id}"
            )
        if instances:
            return  # loading again would start a second instance (`key:2`)
        with self.tracking_load(target.server_model_id):
            if self.loads_through_chat(target):
                try:
                    await self.chat_load(target, progress)
                    return
                except AdapterError as error:
                    if error.code != ErrorCode.NOT_LOADED:  # not "JIT loading is off"
                        raise
            await self.manual_load(target)

    def loads_through_chat(self, target: LoadTarget) -> bool:
        via = target.options.get("load_via")
        if via in ("chat", "manual"):
            return via == "chat" and target.model_type == "llm"
        engine_options = any(k in target.options for k in LLM_LOAD_FIELDS)
        return target.model_type == "llm" and self.single_llm and not engine_options

    async def manual_load(self, target: LoadTarget) -> None:
        body: dict[str, Any] = {"model": target.server_model_id}
        options = target.options
        if "context_length" in options:
            body["context_length"] = options["context_length"]
        if target.model_type == "llm":
            body.update({k: options[k] for k in LLM_LOAD_FIELDS if k in options})
        answer = await self.json("POST", "/api/v1/models/load", json=body, timeout=target.timeout_s)
        if answer.get("status") != "loaded":
            raise AdapterError(ErrorCode.LOAD_FAILED, f"LM Studio answered {answer}")

    async def chat_load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        """Load by starting a one-token chat and follow its stream up to `model_load.end`;
        the answer itself is not waited for. `store: false` keeps it out of LM Studio's
        chat history."""
        body: dict[str, Any] = {
            "model": target.server_model_id,
            "input": "Hi",
            "max_output_tokens": 1,
            "stream": True,
            "store": False,
        }
        if "context_length" in target.options:
            body["context_length"] = target.options["context_length"]
        timeout = httpx.Timeout(target.timeout_s, connect=self.client.timeout.connect)
        async with self.open_stream("POST", "/api/v1/chat", json=body, timeout=timeout) as stream:
            async for name, data in self.sse_messages(stream):
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                kind = event.get("type", name)
                if kind == "model_load.progress":
                    progress(float(event.get("progress", 0.0)))
                elif kind == "model_load.end":
                    progress(1.0)
                    return
                elif kind == "error":
                    raise chat_error(event)
                elif kind in ("prompt_processing.start", "message.start", "chat.end"):
                    break  # the model was loaded already (someone else loaded it meanwhile)
        if not await self.instances_of(target.server_model_id):
            raise AdapterError(
                ErrorCode.LOAD_FAILED,
                f"LM Studio's chat stream ended without loading {target.server_model_id}",
            )

    async def unload(self, server_model_id: str) -> None:
        for instance_id in await self.instances_of(server_model_id) or []:
            await self.json("POST", "/api/v1/models/unload", json={"instance_id": instance_id})

    async def before_inference(self, call: InferenceCall) -> None:
        if not await self.instances_of(call.server_model_id):
            raise AdapterError(
                ErrorCode.NOT_LOADED, f"{call.server_model_id} is not loaded in LM Studio"
            )

    async def health(self) -> None:
        body = await self.json("GET", "/lmstudio-greeting")
        if not (isinstance(body, dict) and body.get("lmstudio")):
            raise AdapterError(ErrorCode.SERVER_ERROR, "the server does not greet as LM Studio")


def loaded_config(instances: list[dict[str, Any]]) -> dict[str, Any]:
    """The load config of a loaded model's first instance (its context, its `parallel`)."""
    config = instances[0].get("config") if instances else None
    return config if isinstance(config, dict) else {}


def parallel(instances: list[dict[str, Any]]) -> int | None:
    """The predictions a loaded LLM runs at once (its load config's `parallel`, LM Studio
    0.4's continuous batching), from its first instance; None when it does not say."""
    return positive_count(loaded_config(instances).get("parallel"))


def chat_error(event: dict[str, Any]) -> AdapterError:
    """An `error` event of the native chat stream, mapped by its message like any answer."""
    error = event.get("error") if isinstance(event.get("error"), dict) else {}
    status = CHAT_ERROR_STATUS.get(error.get("type"), 500)
    return classify(status, str(error.get("message") or error.get("type") or "chat error"))

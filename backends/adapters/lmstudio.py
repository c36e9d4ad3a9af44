"""LM Studio (0.4+ native REST API; 0.3.x listing as a fallback).

Loads go through `POST /api/v1/models/load`, a *manual* load: LM Studio's JIT auto-evict
never touches it, and it takes the engine options. The only HTTP source of load progress is
the native chat stream, which would make an inference the load trigger (and JIT-evict other
models), so this adapter does not report progress. Inference is refused with `not_loaded`
when the model is not resident, so LM Studio's JIT loading never starts a load behind the
scheduler's back.
"""

from typing import Any

from .base import AdapterError, ErrorCode, InferenceCall, LoadTarget, ProgressCallback, ServerModel
from .http import HttpAdapter

# Load fields of `POST /api/v1/models/load`; the engine-specific ones only apply to LLMs.
LLM_LOAD_FIELDS = ("eval_batch_size", "flash_attention", "num_experts", "offload_kv_cache_to_gpu")
V0_TYPES = {"llm": "llm", "vlm": "llm", "embeddings": "embedding"}


class LMStudioAdapter(HttpAdapter):
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
            instances = [i["id"] for i in m.get("loaded_instances") or []]
            size = m.get("size_bytes")
            model = ServerModel(
                id=m["key"],
                state="loaded" if instances else "unloaded",
                type="embedding" if m.get("type") == "embedding" else "llm",
                size_mb=size // 2**20 if size else None,
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
        body: dict[str, Any] = {"model": target.server_model_id}
        options = target.options
        if "context_length" in options:
            body["context_length"] = options["context_length"]
        if target.model_type == "llm":
            body.update({k: options[k] for k in LLM_LOAD_FIELDS if k in options})
        with self.tracking_load(target.server_model_id):
            answer = await self.json(
                "POST", "/api/v1/models/load", json=body, timeout=target.timeout_s
            )
        if answer.get("status") != "loaded":
            raise AdapterError(ErrorCode.LOAD_FAILED, f"LM Studio answered {answer}")

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

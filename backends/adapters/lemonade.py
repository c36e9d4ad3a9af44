"""Lemonade Server (`/api/v1`).

`POST /api/v1/load` blocks until the model is loaded and takes the recipe options
(`ctx_size`, `llamacpp_backend`, `llamacpp_args`...; `context_length` is translated to
`ctx_size`). Loaded models are those in `/api/v1/health` → `all_models_loaded`. Lemonade
auto-loads on inference, so inference first checks that list and answers `not_loaded`.
"""

from typing import Any

from .base import AdapterError, ErrorCode, InferenceCall, LoadTarget, ProgressCallback, ServerModel
from .http import HttpAdapter

LOAD_FIELDS = (
    "ctx_size",
    "llamacpp_backend",
    "llamacpp_args",
    "merge_args",
    "whispercpp_backend",
    "whispercpp_args",
    "pinned",
    "save_options",
    "steps",
    "cfg_scale",
    "width",
    "height",
)
TYPES = {"embeddings": "embedding", "embedding": "embedding", "reranking": "reranking"}


class LemonadeAdapter(HttpAdapter):
    inference_paths = {
        "chat": "/api/v1/chat/completions",
        "completion": "/api/v1/completions",
        "embedding": "/api/v1/embeddings",
        "rerank": "/api/v1/reranking",
        "response": "/api/v1/responses",
    }

    async def loaded(self) -> set[str]:
        health = await self.json("GET", "/api/v1/health")
        return {m["model_name"] for m in health.get("all_models_loaded") or []}

    async def list_models(self) -> list[ServerModel]:
        body = await self.json("GET", "/api/v1/models")
        loaded = await self.loaded()
        found = []
        for m in body.get("data", []):
            labels = m.get("labels") or []
            kind = next((TYPES[label] for label in labels if label in TYPES), "llm")
            size = m.get("size")
            found.append(
                ServerModel(
                    id=m["id"],
                    state="loaded" if m["id"] in loaded else "unloaded",
                    type=kind,
                    size_mb=int(size * 1024) if size else None,
                )
            )
        return self.with_loading(found)

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        options = target.options
        body: dict[str, Any] = {"model_name": target.server_model_id}
        if "context_length" in options:
            body["ctx_size"] = options["context_length"]
        body.update({k: options[k] for k in LOAD_FIELDS if k in options})
        with self.tracking_load(target.server_model_id):
            try:
                await self.json("POST", "/api/v1/load", json=body, timeout=target.timeout_s)
            except AdapterError as error:
                # 500 = the backend failed to load; 409 = every slot is pinned.
                if error.code == ErrorCode.SERVER_ERROR or error.status == 409:
                    raise AdapterError(
                        ErrorCode.LOAD_FAILED, error.message, status=error.status
                    ) from error
                raise

    async def unload(self, server_model_id: str) -> None:
        try:
            await self.json("POST", "/api/v1/unload", json={"model_name": server_model_id})
        except AdapterError as error:
            if error.code != ErrorCode.NOT_LOADED:  # 404 "… not loaded": already gone
                raise

    async def before_inference(self, call: InferenceCall) -> None:
        if call.server_model_id not in await self.loaded():
            raise AdapterError(
                ErrorCode.NOT_LOADED, f"{call.server_model_id} is not loaded in Lemonade"
            )

    async def health(self) -> None:
        await self.request("GET", "/live")

"""llama-swap: a proxy that starts and stops upstream servers defined in its YAML config.

It has no load call: any request for a model starts it. `load` sends one that is not an
inference, `GET /upstream/<model>/health` (a raw passthrough, answered once the upstream
passes llama-swap's own health check), then confirms in `/running` that the model is
`ready`. Inference first checks `/running`, so a request never becomes the load. What a
model loads with (context size...) is its `cmd` in the config; there are no load options.
"""

from typing import Any
from urllib.parse import quote

import httpx

from .base import (
    AdapterError,
    ErrorCode,
    InferenceCall,
    LoadTarget,
    ProgressCallback,
    ServerModel,
    positive_count,
)
from .http import HttpAdapter
from .http_errors import TRANSPORT_ERRORS, connection_error, error_from_response
from .llamacpp import props_facts

RUNNING_STATES = {"ready": "loaded", "starting": "loading"}  # stopping: on its way out


class LlamaSwapAdapter(HttpAdapter):
    takes_load_options = False  # each model's arguments are in its `cmd`

    async def processes(self) -> dict[str, str]:
        body = await self.json("GET", "/running")
        return {r["model"]: r.get("state", "") for r in body.get("running") or []}

    async def list_models(self) -> list[ServerModel]:
        body = await self.json("GET", "/v1/models")
        running = await self.processes()
        found = []
        for entry in body.get("data", []):
            kind = ((entry.get("meta") or {}).get("llamaswap") or {}).get("type", "model")
            if kind != "model":  # aliases, peers, selectors, profiles
                continue
            state = RUNNING_STATES.get(running.get(entry["id"], ""), "unloaded")
            # `context_length` is listed where its config sets one.
            context = positive_count(entry.get("context_length"))
            found.append(ServerModel(id=entry["id"], state=state, context_length=context))
        return found

    async def model_facts(self, listed: list[ServerModel]) -> dict[str, dict[str, Any]]:
        """Each running model's slots and capabilities, as its upstream's `/props` says them
        when it is a llama-server (`total_slots`, its `--parallel`; other upstreams have no
        /props). Asked through `/upstream/<model>/props` only while `/running` says it is
        ready, since that passthrough would start a stopped model."""
        found = {}
        for m in listed:
            if m.state != "loaded" or (await self.processes()).get(m.id) != "ready":
                continue
            try:
                props = await self.json("GET", f"/upstream/{quote(m.id, safe='/')}/props")
            except AdapterError:
                continue
            if facts := props_facts(props):
                found[m.id] = facts
        return found

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        model = target.server_model_id
        if (await self.processes()).get(model) == "ready":
            return
        try:
            answer = await self.client.get(
                f"/upstream/{quote(model, safe='/')}/health", timeout=target.timeout_s
            )
        except TRANSPORT_ERRORS as exc:
            raise connection_error(exc) from exc
        # Any answer from the upstream (even a 404 from a server without /health) means it
        # is up; only llama-swap's own errors (marked `"src": "llama-swap"`) concern the load.
        if answer.status_code >= 400 and own_error(answer):
            error = error_from_response(answer.status_code, answer.text, answer.headers)
            if error.code in (ErrorCode.SERVER_ERROR, ErrorCode.BUSY):
                raise AdapterError(ErrorCode.LOAD_FAILED, error.message, status=error.status)
            raise error
        state = (await self.processes()).get(model)
        if state != "ready":
            raise AdapterError(
                ErrorCode.LOAD_FAILED, f"llama-swap reports {model} as {state or 'stopped'}"
            )

    async def unload(self, server_model_id: str) -> None:
        # Blocks until the process has stopped.
        await self.request("POST", f"/api/models/unload/{quote(server_model_id, safe='/')}")

    async def before_inference(self, call: InferenceCall) -> None:
        if (await self.processes()).get(call.server_model_id) != "ready":
            raise AdapterError(
                ErrorCode.NOT_LOADED, f"{call.server_model_id} is not running in llama-swap"
            )

    async def keep_chunks(self, chunks):
        """Drop `sendLoadingState` progress text: chunks with no id or object (nor a
        Responses API event's type)."""
        async for chunk in chunks:
            if "id" in chunk or "object" in chunk or "type" in chunk:
                yield chunk

    async def health(self) -> None:
        await self.request("GET", "/health")


def own_error(response: httpx.Response) -> bool:
    try:
        return response.json().get("src") == "llama-swap"
    except (ValueError, AttributeError):
        return response.text.startswith("llama-swap:")

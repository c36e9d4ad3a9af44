"""Any OpenAI-compatible server. It has no load control: what `/v1/models` lists is loaded."""

from collections.abc import AsyncIterator
from typing import Any

from .base import AdapterError, ErrorCode, InferenceCall, LoadTarget, ProgressCallback, ServerModel
from .http import COUNT_TOKENS_PATHS, NEVER_STREAMED, HttpAdapter, counting_usage


class OpenAIAdapter(HttpAdapter):
    controls_loading = False
    takes_load_options = False  # the model's arguments are set on the server
    # Often a single-model llama-server, which closes the connection after a streamed
    # answer without saying so (see `LlamaCppAdapter`).
    connection_per_call = True
    # Sent on to the server, which answers it if it is a llama-server.
    inference_paths = COUNT_TOKENS_PATHS

    async def list_models(self) -> list[ServerModel]:
        body = await self.json("GET", "/v1/models")
        return [ServerModel(id=m["id"], state="loaded") for m in body.get("data", [])]

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        """No load control: the model is 'loaded' if the server lists it."""
        listed = {m.id for m in await self.list_models()}
        if target.server_model_id not in listed:
            raise AdapterError(
                ErrorCode.NOT_FOUND, f"{target.server_model_id} is not listed by /v1/models"
            )
        progress(1.0)

    async def unload(self, server_model_id: str) -> None:
        """Nothing to do: the server decides what it keeps in memory."""

    def body(self, call: InferenceCall) -> dict[str, Any]:
        body = {**call.payload, "model": call.server_model_id}
        if call.kind not in NEVER_STREAMED:
            body["stream"] = call.stream
        return counting_usage(call, body)

    async def run(self, call: InferenceCall) -> dict[str, Any]:
        return await self.json("POST", self.path_for(call), json=self.body(call))

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        path = self.path_for(call)
        async with self.open_stream("POST", path, json=self.body(call)) as response:
            async for event in self.sse_events(response):
                yield event

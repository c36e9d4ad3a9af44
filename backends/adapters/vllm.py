"""vLLM: one process serves one model, loaded for as long as the process runs.

Its sleep mode is the only unload (`POST /sleep?level=N`, level 1 keeps the weights in host
RAM, level 2 drops them; load option `sleep_level`) and wake-up the only load
(`POST /wake_up`). Both need `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode` on the
server; without them the model is simply always loaded. A sleeping engine is not woken by
requests (and older ones crash), so inference checks `/is_sleeping` first.

What it runs, whoever sent it, its `/metrics` say (`activity`): clients that call it directly
keep it from being put to sleep under them.
"""

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .base import (
    Activity,
    AdapterError,
    ErrorCode,
    InferenceCall,
    LoadTarget,
    ProgressCallback,
    ServerModel,
    positive_count,
)
from .http import OPENAI_PATHS, HttpAdapter

SLEEP_WAIT_S = 120.0
# Its gauges of the requests on a model now, and its counter of those it finished.
NOW = ("vllm:num_requests_running", "vllm:num_requests_waiting")
FINISHED = "vllm:request_success_total"


class VLLMAdapter(HttpAdapter):
    inference_paths = {k: v for k, v in OPENAI_PATHS.items() if k != "message"}  # none there
    tells_activity = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.can_sleep = True  # until /is_sleeping turns out not to exist
        self.sleep_level: dict[str, int] = {}

    async def sleeping(self) -> bool:
        if not self.can_sleep:
            return False
        try:
            body = await self.json("GET", "/is_sleeping")
        except AdapterError as error:
            if error.status != 404:
                raise
            self.can_sleep = False
            return False
        return bool(body.get("is_sleeping"))

    async def served(self) -> dict[str, dict[str, Any]]:
        """Its models' listing entries by id."""
        body = await self.json("GET", "/v1/models")
        return {entry["id"]: entry for entry in body.get("data", [])}

    async def list_models(self) -> list[ServerModel]:
        served = await self.served()
        state = "sleeping" if await self.sleeping() else "loaded"
        return [
            ServerModel(id=model_id, state=state, context_length=context_of(entry))
            for model_id, entry in served.items()
        ]

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        if target.server_model_id not in await self.served():
            raise AdapterError(ErrorCode.NOT_FOUND, f"vLLM does not serve {target.server_model_id}")
        self.sleep_level[target.server_model_id] = int(target.options.get("sleep_level", 1))
        if not await self.sleeping():
            return
        await self.request("POST", "/wake_up", timeout=target.timeout_s)

        # Older versions answer before the engine is awake.
        async def awake() -> bool:
            return not await self.sleeping()

        await self.wait_until(awake, "vLLM to wake up", target.timeout_s)

    async def unload(self, server_model_id: str) -> None:
        if await self.sleeping():
            return
        if not self.can_sleep:
            raise AdapterError(
                ErrorCode.BAD_REQUEST,
                "vLLM can only unload by sleeping: start it with VLLM_SERVER_DEV_MODE=1 "
                "and --enable-sleep-mode",
            )
        level = self.sleep_level.get(server_model_id, 1)
        await self.request("POST", "/sleep", params={"level": str(level)})
        await self.wait_until(self.sleeping, "vLLM to fall asleep", SLEEP_WAIT_S)

    async def before_inference(self, call: InferenceCall) -> None:
        if await self.sleeping():
            raise AdapterError(ErrorCode.NOT_LOADED, "vLLM is sleeping")

    async def health(self) -> None:
        await self.request("GET", "/health")

    async def activity(self, server_model_id: str) -> Activity | None:
        """From `/metrics`: the requests its engine runs or queues on the model now, and how
        many it finished (by any finish reason); None where they do not name the model."""
        try:
            text = (await self.request("GET", "/metrics")).text
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        except (AdapterError, ValueError):
            return None
        mine = [s for s in samples if s.labels.get("model_name") == server_model_id]
        if not any(s.name == FINISHED for s in mine):
            return None
        running = sum(int(s.value) for s in mine if s.name in NOW)
        return Activity(running, sum(int(s.value) for s in mine if s.name == FINISHED))


def context_of(entry: dict[str, Any]) -> int | None:
    """The context the engine was started with (`--max-model-len`), as its listing says."""
    return positive_count(entry.get("max_model_len"))

"""The one async interface every server kind speaks. Adapters translate; they never decide.

Every method may raise `AdapterError`. Its `code` is one of `ErrorCode`, which is all the
policy and the runtime act on; `message` keeps the server's own words for the trace.
"""

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple


class ErrorCode(StrEnum):
    NOT_FOUND = "not_found"  # the server does not have this model
    LOAD_FAILED = "load_failed"  # failed to load / out of memory
    NOT_LOADED = "not_loaded"  # the model is no longer loaded: route the request again
    BUSY = "busy"  # try later (retry_after_s)
    CONNECTION = "connection"  # refused, reset, timed out, crashed
    SERVER_ERROR = "server_error"  # 5xx
    BAD_REQUEST = "bad_request"  # the request itself is wrong: never retried
    # Its prompt (with the answer it asks room for) is longer than the model's context on
    # that server: never retried; OpenAI's code, which apps check to shorten and try again.
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class AdapterError(Exception):
    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        return self.code not in (
            ErrorCode.BAD_REQUEST,
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            ErrorCode.NOT_FOUND,
        )

    @property
    def server_fault(self) -> bool:
        """Counts toward the server's circuit breaker."""
        return self.code in (ErrorCode.CONNECTION, ErrorCode.SERVER_ERROR)


CAPABILITIES = ("tools", "vision", "thinking")
"""What an LLM may be known to take besides text: tool calls, images, a thinking switch."""


def positive_count(value: Any) -> int | None:
    """A count a server reports (a context, slots), if it is a positive whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True, slots=True)
class ServerModel:
    """One model as the server lists it."""

    id: str
    state: str = "unloaded"  # unloaded | loading | loaded | sleeping
    type: str = "llm"
    size_mb: int | None = None
    slots: int | None = None
    """Requests of it the server serves at once, where the server says (llama-server, LM
    Studio, llama-swap over a llama-server)."""
    capabilities: tuple[str, ...] | None = None
    """Which of `CAPABILITIES` it has, where the server says (LM Studio, Ollama,
    llama-server's `/props`)."""
    context_length: int | None = None
    """The tokens a request to it may use, where the server says what it runs with
    (llama-server's `/props`, vLLM, llama-swap's configured models, a model LM Studio or
    Ollama has loaded); not the weights' trained maximum, which a server seldom loads."""


@dataclass(frozen=True, slots=True)
class LoadTarget:
    server_model_id: str
    model_type: str = "llm"
    options: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 150.0


@dataclass(frozen=True, slots=True)
class InferenceCall:
    kind: str  # chat | completion | embedding | rerank | response | message
    server_model_id: str
    payload: dict[str, Any] = field(repr=False)  # the caller's prompt: never in a log line
    stream: bool = False
    load_options: dict[str, Any] = field(default_factory=dict)


ProgressCallback = Callable[[float], None]
"""Called with a fraction 0..1 while a load runs, where the server reports progress."""


class Activity(NamedTuple):
    """What a server says it runs on a model, whoever sent the requests."""

    running: int  # requests it runs on the model now
    tasks: int  # grows with each request it runs there (llama.cpp: its slots' last task id)


class Adapter:
    """Base class: subclasses implement what their server can do.

    - `list_models()` → every model the server has, with its state.
    - `load(target, progress)` → returns when the model is loaded; raises on failure.
    - `unload(server_model_id)` → returns when it is gone.
    - `run(call)` → the OpenAI-shaped response body (non-streamed).
    - `stream(call)` → OpenAI chat/completion chunks as dicts, in order.
    - `health()` → returns if the server answers; raises `AdapterError(CONNECTION)` if not.
    """

    controls_loading = True
    tells_activity = False  # `activity` answers: asked of loaded models with an idle TTL
    takes_load_options = True
    """A load applies `LoadTarget.options` (context size, …); where not, they belong in the
    server's own configuration (a router's preset, llama-swap's `cmd`)."""
    stops_loads = False
    """`unload(id)` of a model still loading stops that load (the policy stops a load that
    nobody waits for any more, so that its server can load another at once)."""

    async def list_models(self) -> list[ServerModel]:
        raise NotImplementedError

    async def load(self, target: LoadTarget, progress: ProgressCallback) -> None:
        raise NotImplementedError

    async def unload(self, server_model_id: str) -> None:
        raise NotImplementedError

    async def run(self, call: InferenceCall) -> dict[str, Any]:
        raise NotImplementedError

    def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        raise NotImplementedError

    async def health(self) -> None:
        await self.list_models()

    def spell(self, server_model_ids: Iterable[str]) -> None:
        """How the deployments name this server's models, for kinds whose listing names
        them otherwise (Ollama adds `:latest`), so that `list_models` names them as the
        deployments do."""

    async def model_facts(self, listed: list[ServerModel]) -> dict[str, dict[str, Any]]:
        """Facts of listed models (`slots`, `capabilities`) that `list_models` could not say
        without a call per model, by id (for discovery only, which fills what is empty)."""
        return {}

    async def activity(self, server_model_id: str) -> Activity | None:
        """What the server runs on that model, whoever sent it (None where it cannot say):
        the status sync sees a model used by clients that call the server directly."""
        return None

    async def running(self, server_model_id: str) -> int | None:
        """How many requests the server runs on that model now, whoever sent them; None
        where it cannot say."""
        seen = await self.activity(server_model_id)
        return None if seen is None else seen.running

    async def room(self) -> int | None:
        """How many models the server itself runs at once, where it has such a limit and
        stops models by itself beyond it (llama-server's router: `--models-max`)."""
        return None

    async def close(self) -> None:
        """Release connections."""

"""A server's errors as ours: the answer it refused with (`error_from_response`, or an error
inside a stream: `error_from_event`) sorted into an `ErrorCode` by its status and its words,
and a failed connection (`connection_error`) said in plain words."""

import json
import re
from typing import Any

import aiohttp
import httpx

from .base import AdapterError, ErrorCode

NOT_FOUND_WORDS = ("not found", "no such model", "does not exist", "unknown model")
NOT_LOADED_WORDS = (
    "not loaded",
    "no model loaded",
    "no models loaded",
    "model is unloaded",
    "is sleeping",
    # llama-server's router reaches no child for the model: it stopped it (to make room at
    # --models-max, or asked to), or it exited. Its own failure would not be this answer.
    "proxy error: could not establish connection",
)
# Ollama's own out-of-memory substrings plus LM Studio's and Lemonade's load-failure wording.
LOAD_FAILED_WORDS = (
    "out of memory",
    "out of device memory",
    "cudamalloc failed",
    "failed to allocate",
    "not enough memory",
    "insufficient memory",
    "insufficient system resources",
    "model loading was stopped",
    "model loading aborted",
    "failed to load",
    "model_load_error",
)
OOM_WORD = re.compile(r"\boom\b")
# A web page's head (its title and styles say nothing the body does not) and its tags.
HTML_HEAD = re.compile(r"<head\b.*?</head>", re.IGNORECASE | re.DOTALL)
HTML_TAG = re.compile(r"<[^>]*>")
BUSY_WORDS = ("server busy", "too many requests", "loading model", "not ready", "overloaded")
# Full for now, whatever the status: llama-server's router at --models-max with every model
# busy answers a load with a 500 that says so. Given up after the attempts, a model fit to
# load was failed for good.
TRY_LATER_WORDS = ("model limit reached", "try again later")
# The request is too large for the model as it is loaded: the same answer on every retry and
# every server, whatever its status (llama-server answers an embedding input over its batch
# size with a 500), and no fault of the server's: retried, it opened the breaker for all.
TOO_LARGE_WORDS = ("too large to process",)  # llama-server: an input over its batch size
CONTEXT_WORDS = (
    "exceeds the available context size",  # llama-server
    "maximum context length",  # vLLM
)
# The same said by name: OpenAI's code (newer vLLM sends it), llama-server's error type.
CONTEXT_NAMES = {"context_length_exceeded", "exceed_context_size_error"}


def error_from_response(
    status: int, text: str, headers: httpx.Headers | None = None
) -> AdapterError:
    """Map a server's error answer to one of ours, keeping its message."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    message = message_of(body) if body is not None else one_line(text)
    if CONTEXT_NAMES & names_of(body):
        return AdapterError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, message, status=status)
    return classify(status, message or f"HTTP {status}", retry_after_of(headers))


def names_of(body: Any) -> set[str]:
    """The names an error body gives its error (`code` and `type`, nested or flat)."""
    if not isinstance(body, dict):
        return set()
    error = body.get("error")
    said = [error, body] if isinstance(error, dict) else [body]
    return {v for part in said for k in ("code", "type") if isinstance(v := part.get(k), str)}


def one_line(text: str) -> str:
    """A body that is not JSON, on one line: a web page's text without its tags (a proxy's
    or a web server's error page at a wrong address, not an inference server's answer)."""
    if text.lstrip().startswith("<"):
        text = HTML_TAG.sub(" ", HTML_HEAD.sub(" ", text))
    return " ".join(text.split())[:500]


def error_from_event(event: dict[str, Any]) -> AdapterError:
    """A `{"error": …}` object sent inside a stream (llama.cpp, vLLM, Ollama NDJSON)."""
    error = event.get("error")
    status = error.get("code") if isinstance(error, dict) else None
    return classify(status if isinstance(status, int) else 500, message_of(event) or "stream error")


def classify(status: int, message: str, retry_after: float | None = None) -> AdapterError:
    lowered = message.lower()
    if any(w in lowered for w in NOT_LOADED_WORDS):
        code = ErrorCode.NOT_LOADED
    elif any(w in lowered for w in LOAD_FAILED_WORDS) or OOM_WORD.search(lowered):
        code = ErrorCode.LOAD_FAILED
    elif any(w in lowered for w in CONTEXT_WORDS):
        code = ErrorCode.CONTEXT_LENGTH_EXCEEDED
    elif any(w in lowered for w in TOO_LARGE_WORDS):
        code = ErrorCode.BAD_REQUEST
    elif status == 404 or any(w in lowered for w in NOT_FOUND_WORDS):
        code = ErrorCode.NOT_FOUND
    elif (
        status == 429
        or (status == 503 and (retry_after is not None or _busy(lowered)))
        or any(w in lowered for w in TRY_LATER_WORDS)
    ):
        code = ErrorCode.BUSY
    elif 400 <= status < 500 or status == 501:
        # 501: the server cannot do this at all (llama-server's embeddings without
        # --embeddings): the same answer on every retry, and no fault of its health.
        code = ErrorCode.BAD_REQUEST
    else:
        code = ErrorCode.SERVER_ERROR
    return AdapterError(code, message, status=status, retry_after_s=retry_after)


def _busy(lowered: str) -> bool:
    return any(w in lowered for w in BUSY_WORDS)


def retry_after_of(headers: httpx.Headers | None) -> float | None:
    if not headers:
        return None
    if value := headers.get("retry-after-ms"):
        try:
            return float(value) / 1000
        except ValueError:
            pass
    if value := headers.get("retry-after"):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def message_of(body: Any) -> str:
    """`error.message` → `error` (a string) → `message` → `detail` → the whole body."""
    if not isinstance(body, dict):
        return str(body)[:500]
    error = body.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    for key in ("message", "detail"):
        if body.get(key):
            return str(body[key])
    return json.dumps(body)[:500]


TRANSPORT_ERRORS = (httpx.TransportError, aiohttp.ClientError)


# What a transport failure means, in words an app developer reads in its error (the
# first that matches; the transport's own name and text follow, for the operator).
SAID_OF_TRANSPORT: tuple[tuple[tuple[type[Exception], ...], str], ...] = (
    ((aiohttp.ClientConnectorError, httpx.ConnectError), "could not connect to the server"),
    ((aiohttp.ServerTimeoutError, httpx.TimeoutException), "the server did not answer in time"),
    (
        (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
        "the server closed the connection before its answer ended",
    ),
    ((aiohttp.ClientResponseError,), "the server's answer is not HTTP"),
)


def connection_error(exc: Exception) -> AdapterError:
    """A failure to reach the server or to read its answer, said in plain words, then named
    by what went wrong (the transport reports some of aiohttp's errors under a broader httpx
    name: a dropped connection as `ConnectTimeout`)."""
    cause = exc.__cause__ if isinstance(exc.__cause__, aiohttp.ClientError) else exc
    said = next((words for kinds, words in SAID_OF_TRANSPORT if isinstance(cause, kinds)), None)
    named = f"{type(cause).__name__}: {cause}"
    return AdapterError(ErrorCode.CONNECTION, f"{said} ({named})" if said else named)

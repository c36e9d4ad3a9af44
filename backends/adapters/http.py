"""Shared HTTP plumbing: one pooled `httpx.AsyncClient` per server, error mapping, SSE."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from .base import Adapter, AdapterError, ErrorCode

NOT_FOUND_WORDS = ("not found", "no such model", "does not exist", "unknown model")
NOT_LOADED_WORDS = ("not loaded", "no model loaded", "model is unloaded", "is sleeping")
LOAD_FAILED_WORDS = ("out of memory", "failed to load", "oom", "insufficient memory")


def error_from_response(
    status: int, text: str, headers: httpx.Headers | None = None
) -> AdapterError:
    """Map a server's error answer to one of ours, keeping its message."""
    message = _message_of(text) or f"HTTP {status}"
    lowered = message.lower()
    retry_after = None
    if headers and (value := headers.get("retry-after")):
        try:
            retry_after = float(value)
        except ValueError:
            retry_after = None
    if any(w in lowered for w in NOT_LOADED_WORDS):
        code = ErrorCode.NOT_LOADED
    elif status == 404 or any(w in lowered for w in NOT_FOUND_WORDS):
        code = ErrorCode.NOT_FOUND
    elif status in (429, 503) and retry_after is not None or status == 429:
        code = ErrorCode.BUSY
    elif any(w in lowered for w in LOAD_FAILED_WORDS):
        code = ErrorCode.LOAD_FAILED
    elif 400 <= status < 500:
        code = ErrorCode.BAD_REQUEST
    else:
        code = ErrorCode.SERVER_ERROR
    return AdapterError(code, message, status=status, retry_after_s=retry_after)


def _message_of(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if error:
            return str(error)
    return text.strip()[:500]


class HttpAdapter(Adapter):
    """Base for every kind that speaks HTTP."""

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise AdapterError(ErrorCode.CONNECTION, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.text, response.headers)
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise AdapterError(
                ErrorCode.SERVER_ERROR, f"{path} answered with something that is not JSON"
            ) from exc

    @asynccontextmanager
    async def open_stream(self, method: str, path: str, **kwargs: Any):
        try:
            async with self.client.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    body = (await response.aread()).decode(errors="replace")
                    raise error_from_response(response.status_code, body, response.headers)
                yield response
        except httpx.TransportError as exc:
            raise AdapterError(ErrorCode.CONNECTION, f"{type(exc).__name__}: {exc}") from exc

    async def sse_events(self, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        """The JSON payloads of an SSE stream, up to `[DONE]`."""
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict) and "error" in event and not event.get("choices"):
                raise error_from_response(500, data)
            yield event

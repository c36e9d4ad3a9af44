"""Shared HTTP plumbing: one `httpx.AsyncClient` per server (its connections pooled, or one
per call for kinds whose server closes them unannounced), SSE, and the OpenAI-compatible
inference every server kind also speaks. What a server's errors mean: `http_errors`."""

import asyncio
import contextlib
import functools
import http.cookiejar
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import certifi
import httpx
from httpx_aiohttp import AiohttpTransport

from .. import messages_api, responses_api
from .base import Adapter, AdapterError, ErrorCode, InferenceCall, ServerModel
from .http_errors import (
    TRANSPORT_ERRORS,
    classify,
    connection_error,
    error_from_event,
    error_from_response,
)

OPENAI_PATHS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
    "rerank": "/v1/rerank",  # llama-server's and vLLM's (Jina's and Cohere's shape)
    "response": "/v1/responses",  # OpenAI's Responses API
    "message": "/v1/messages",  # Anthropic's Messages API
}
# Anthropic's count of a message's tokens: llama-server's; the other kinds' references
# list no such route (Ollama, LM Studio, llama-swap, vLLM, Lemonade).
COUNT_TOKENS_PATHS = {**OPENAI_PATHS, "count_tokens": "/v1/messages/count_tokens"}
NEVER_STREAMED = ("embedding", "rerank", "count_tokens")


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """Built once: loading the CA bundle for every server's client is slow."""
    return ssl.create_default_context(cafile=certifi.where())


AFTER_END_S = 1.0  # how long the rest of a stream is read after its end marker


async def read_to_end(rest: AsyncIterator[Any]) -> None:
    """Read what follows a stream's end marker (the end of its chunked body, normally already
    received), so that httpx keeps the connection for the next call instead of closing it:
    a new connection for every streamed call cost the worker up to a millisecond of CPU and
    put a connect on the path to the first token. A server that sends on for too long is
    cut off."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(AFTER_END_S):
            async for _ in rest:
                pass


def wants_usage(call: InferenceCall) -> bool:
    """Whether the caller asked to see a stream's usage (its last, usage-only chunk)."""
    return bool((call.payload.get("stream_options") or {}).get("include_usage"))


def counting_usage(call: InferenceCall, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat or completion asks the server for its usage whether or not the
    caller did: the stored answer counts its tokens (daily token quotas, the usage report).
    The worker's relay keeps the usage-only chunk from a caller that did not ask."""
    if call.stream and call.kind in ("chat", "completion"):
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


async def with_usage_chunk(
    chunks: AsyncIterator[dict[str, Any]], wanted: bool
) -> AsyncIterator[dict[str, Any]]:
    """Pass chunks through and, when the caller asked for usage but the server only put it on
    its finish chunk (older llama.cpp) or nowhere, end with the OpenAI usage-only chunk."""
    last: dict[str, Any] = {}
    usage = None
    async for chunk in chunks:
        last = chunk
        usage = chunk.get("usage") or usage
        yield chunk
    if wanted and usage and last.get("choices") != []:
        yield {
            "id": last.get("id", ""),
            "object": last.get("object", "chat.completion.chunk"),
            "created": last.get("created", 0),
            "model": last.get("model", ""),
            "choices": [],
            "usage": usage,
        }


MAX_CONNECTIONS = 64  # per server: more than any server's slots
# Under the 5 s that llama-server, uvicorn (vLLM) and Node (LM Studio) keep an idle
# connection: closed here first, a call never goes out on one the server is closing.
KEEPALIVE_S = 4.0


def transport(
    max_connections: int = MAX_CONNECTIONS, force_close: bool = False
) -> AiohttpTransport:
    """httpx's calls carried by aiohttp's connections: the same client API, with about half
    of the CPU a call took through httpcore, anyio and h11 (measured against the bench's
    instant upstream, 1.18-1.47 -> 0.68-0.77 ms per call, streamed 1.54-1.96 -> 0.69-0.93).
    The session is made on the first call, in the loop that makes it; like the httpx client,
    it keeps no cookie. (With a transport of its own, httpx applies no proxy from the
    environment: calls go straight to the server.) `max_connections` 0: no limit;
    `force_close`: a new connection per call, closed after it (`Connection: close`)."""
    return AiohttpTransport(
        client=lambda: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=max_connections,
                keepalive_timeout=None if force_close else KEEPALIVE_S,
                force_close=force_close,
                ssl=ssl_context(),
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
    )


class NoCookies(http.cookiejar.CookieJar):
    """An adapter's client serves every caller, so it keeps no cookie a server sets: one
    caller's would go with the next one's requests. Not reading responses for them also
    saves httpx about 0.05 ms of CPU a call (measured against the bench's instant upstream)."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


class HttpAdapter(Adapter):
    """Base for every kind that speaks HTTP. Inference defaults to the OpenAI-compatible
    routes in `inference_paths`; kinds with a native format override `run`/`stream`."""

    inference_paths = OPENAI_PATHS
    # A server that closes a connection after an answer without saying so (no `Connection:
    # close`) leaves a dead one in the pool, and the next call on it fails at once. A kind
    # whose server does that opens a connection per call instead.
    connection_per_call = False
    poll_interval_s = 0.5  # between looks at a server that changes state in the background
    first_poll_s = 0.01  # the first wait between looks; doubles up to poll_interval_s

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.urls: dict[str, httpx.URL] = {}
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            cookies=NoCookies(),
            transport=transport(force_close=self.connection_per_call),
        )
        if self.connection_per_call:
            del self.client.headers["Connection"]  # httpx's keep-alive: the transport says close
        self.read_timeout_s = read_timeout_s
        self.loading: set[str] = set()  # loads this adapter has under way

    @classmethod
    def server_options(cls, server) -> dict[str, Any]:
        """Constructor arguments a kind takes from its `backends.Server` row."""
        return {}

    async def close(self) -> None:
        await self.client.aclose()

    def url(self, path: str) -> httpx.URL:
        """`path` on the server (after the base URL's own path), parsed once: httpx parses
        a path against the base URL on every call, a tenth of a call's CPU."""
        found = self.urls.get(path)
        if found is None:
            found = self.urls[path] = httpx.URL(self.base_url + path)
        return found

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.client.request(method, self.url(path), **kwargs)
        except TRANSPORT_ERRORS as exc:
            raise connection_error(exc) from exc
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
            async with self.client.stream(method, self.url(path), **kwargs) as response:
                if response.status_code >= 400:
                    body = (await response.aread()).decode(errors="replace")
                    raise error_from_response(response.status_code, body, response.headers)
                yield response
        except TRANSPORT_ERRORS as exc:
            raise connection_error(exc) from exc

    async def sse_messages(
        self, response: httpx.Response, stray: list[str] | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        """(event name, data) per SSE message: blank-line framed, `data:` with or without a
        space, multi-line data joined, `:` comment pings ignored. Lines that are no SSE field
        go to `stray` (llama.cpp's router ends a stream it lost with a bare text line)."""
        event, data = "", []
        async for line in response.aiter_lines():
            if not line:
                if data:
                    yield event, "\n".join(data)
                event, data = "", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            elif stray is not None and field not in ("id", "retry"):
                stray.append(line[:200])
        if data:
            yield event, "\n".join(data)

    async def sse_events(self, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        """The JSON payloads of an OpenAI SSE stream, up to `[DONE]` (or the last event of a
        Responses or Anthropic Messages API stream). An error event raises; a stream cut
        before its end is a lost connection."""
        stray: list[str] = []
        messages = self.sse_messages(response, stray)
        async for _, data in messages:
            if data.strip() == "[DONE]":
                await read_to_end(messages)
                return
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if responses_api.event_type(event) in responses_api.FAILS:
                raise classify(500, responses_api.error_message(event))
            if event.get("error") and not event.get("choices"):
                raise error_from_event(event)
            yield event
            if responses_api.final(event) is not None or messages_api.ends(event):
                await read_to_end(messages)
                return
        said = f" (the server's last words: {stray[-1]})" if stray else ""
        raise AdapterError(ErrorCode.CONNECTION, f"the stream was cut before its end marker{said}")

    # -- OpenAI-compatible inference -----------------------------------------------------

    def path_for(self, call: InferenceCall) -> str:
        try:
            return self.inference_paths[call.kind]
        except KeyError:
            raise AdapterError(
                ErrorCode.BAD_REQUEST, f"this kind of server does not take {call.kind} calls"
            ) from None

    def inference_body(self, call: InferenceCall) -> dict[str, Any]:
        body = {**call.payload, "model": call.server_model_id}
        if call.kind in NEVER_STREAMED:
            body.pop("stream", None)
            body.pop("stream_options", None)
        else:
            body["stream"] = call.stream
            if not call.stream:
                body.pop("stream_options", None)
        return counting_usage(call, body)

    async def before_inference(self, call: InferenceCall) -> None:
        """Kinds whose server would load on demand check here that the model is loaded."""

    def inference_params(self) -> dict[str, str] | None:
        return None

    async def run(self, call: InferenceCall) -> dict[str, Any]:
        path = self.path_for(call)  # a kind the server has no route for asks it nothing
        await self.before_inference(call)
        return await self.json(
            "POST", path, json=self.inference_body(call), params=self.inference_params()
        )

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        if call.kind in NEVER_STREAMED:
            raise AdapterError(ErrorCode.BAD_REQUEST, f"a {call.kind} cannot be streamed")
        path, body = self.path_for(call), self.inference_body(call)
        await self.before_inference(call)
        async with self.open_stream(
            "POST", path, json=body, params=self.inference_params()
        ) as response:
            async for chunk in with_usage_chunk(
                self.keep_chunks(self.sse_events(response)), wants_usage(call)
            ):
                yield chunk

    async def keep_chunks(
        self, chunks: AsyncIterator[dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        """Hook to drop chunks that are not the model's output (llama-swap loading text)."""
        async for chunk in chunks:
            yield chunk

    # -- helpers for kinds with load control ---------------------------------------------

    @contextmanager
    def tracking_load(self, server_model_id: str) -> Iterator[None]:
        """Servers whose listing has no "loading" state learn it from our own loads."""
        self.loading.add(server_model_id)
        try:
            yield
        finally:
            self.loading.discard(server_model_id)

    def with_loading(self, models: list[ServerModel]) -> list[ServerModel]:
        return [
            ServerModel(m.id, "loading", m.type, m.size_mb)
            if m.id in self.loading and m.state == "unloaded"
            else m
            for m in models
        ]

    async def wait_until(
        self, check: Callable[[], Awaitable[bool]], what: str, timeout_s: float
    ) -> None:
        """Poll a server that finishes an operation after answering (unloads, wake-ups):
        the first look at once, then backing off from `first_poll_s`, doubling up to
        `poll_interval_s`, so an operation the server finishes in milliseconds costs
        milliseconds, and a slow one costs a look every `poll_interval_s`."""
        deadline = time.monotonic() + timeout_s
        delay = min(self.first_poll_s, self.poll_interval_s)
        while not await check():
            if time.monotonic() >= deadline:
                raise AdapterError(ErrorCode.SERVER_ERROR, f"gave up waiting: {what}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.poll_interval_s)

"""The generic OpenAI-compatible adapter against the test upstream and a replay."""

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from backends.adapters.base import AdapterError, ErrorCode, InferenceCall, LoadTarget
from backends.adapters.openai import OpenAIAdapter
from backends.adapters.vllm import VLLMAdapter
from tests.conftest import free_port
from tests.support.openai_upstream import Upstream
from tests.support.replay_server import Reply, Stream, sse

CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def make_adapter() -> Callable[[str], OpenAIAdapter]:
    return partial(OpenAIAdapter, api_key="sk-test")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream(["qwen3-8b"]) as upstream:
        yield upstream


@pytest.fixture
def adapter(upstream: Upstream, adapter_on: Callable[[str], OpenAIAdapter]) -> OpenAIAdapter:
    """Most tests here run against the test upstream; the rest script a replay."""
    return adapter_on(upstream.url)


async def test_lists_what_the_server_lists_as_loaded(adapter):
    assert [(m.id, m.state) for m in await adapter.list_models()] == [("qwen3-8b", "loaded")]


async def test_keeps_no_cookie_a_server_sets(adapter, upstream):
    """An adapter's client serves every caller: a cookie that one answer sets must not go
    with the next caller's request."""
    upstream.reply_headers = {"Set-Cookie": "session=abc; Path=/"}
    call = InferenceCall("chat", "qwen3-8b", CHAT)
    for _ in range(2):
        await adapter.run(call)
    assert "cookie" not in {name.lower() for name in upstream.received[-1]["headers"]}


async def test_load_checks_the_listing(adapter):
    seen: list[float] = []
    await adapter.load(LoadTarget("qwen3-8b"), seen.append)
    assert seen == [1.0]
    with pytest.raises(AdapterError) as raised:
        await adapter.load(LoadTarget("nope"), seen.append)
    assert raised.value.code == ErrorCode.NOT_FOUND


async def test_run_and_stream(upstream, adapter):
    result = await adapter.run(InferenceCall("chat", "qwen3-8b", CHAT))
    assert result["choices"][0]["message"]["content"] == "Hello from upstream"
    call = InferenceCall("chat", "qwen3-8b", {**CHAT, "stream": True}, stream=True)
    chunks = [c async for c in adapter.stream(call)]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text == "Hello from upstream"
    assert chunks[-1]["usage"]["total_tokens"] == 4  # asked for always: the answer counts it
    assert upstream.received[0]["body"] == {**CHAT, "model": "qwen3-8b", "stream": False}
    assert upstream.received[1]["body"]["stream_options"] == {"include_usage": True}
    assert upstream.received[0]["headers"]["Authorization"] == "Bearer sk-test"


async def test_each_call_has_a_connection_of_its_own(upstream, adapter):
    """Often in front of llama-server, which closes a connection after a streamed answer
    without saying so: a call sent on it after that failed at once. Each call asks for a
    connection of its own (`Connection: close`), whatever the server keeps open."""
    upstream.chunked_streams = True
    call = InferenceCall("chat", "qwen3-8b", {**CHAT, "stream": True}, stream=True)
    for _ in range(2):
        chunks = [c async for c in adapter.stream(call)]
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    await adapter.run(InferenceCall("chat", "qwen3-8b", CHAT))
    await adapter.run(InferenceCall("chat", "qwen3-8b", CHAT))

    peers = [r["peer"] for r in upstream.received]
    assert len(set(peers)) == 4
    assert {r["headers"]["Connection"] for r in upstream.received} == {"close"}


async def test_a_kind_that_keeps_connections_sends_the_next_call_on_the_same_one(upstream):
    """A server that keeps the connection open after a stream (a chunked body, as vLLM
    sends) gets the next call on the same connection, for kinds that pool them."""
    adapter = VLLMAdapter(upstream.url)
    upstream.chunked_streams = True
    call = InferenceCall("chat", "qwen3-8b", {**CHAT, "stream": True}, stream=True)
    try:
        for _ in range(2):
            chunks = [c async for c in adapter.stream(call)]
            assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        await adapter.run(InferenceCall("chat", "qwen3-8b", CHAT))
    finally:
        await adapter.close()

    first, *others = [r["peer"] for r in upstream.received]
    assert others == [first, first]


async def test_errors_keep_the_servers_message(upstream, adapter):
    upstream.fail_next = [(503, "engine is currently overloaded"), (400, "bad temperature")]
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "qwen3-8b", CHAT))
    assert (raised.value.code, raised.value.message) == (
        ErrorCode.BUSY,
        "engine is currently overloaded",
    )
    with pytest.raises(AdapterError) as raised:
        await adapter.run(InferenceCall("chat", "qwen3-8b", CHAT))
    assert (raised.value.code, raised.value.message) == (ErrorCode.BAD_REQUEST, "bad temperature")


async def test_sse_parsing_follows_the_spec(server, adapter_on):
    """No space after `data:`, comment pings, multi-line data, and a cut before [DONE]."""
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": "a"}}]}
    pieces = [": ping\n\n", 'data:{"id": "c",\ndata: "choices": []}\n\n', *sse(chunk, done=False)]
    server.on("POST", "/v1/completions", Stream(pieces))
    call = InferenceCall("completion", "m", {"prompt": "x", "stream": True}, stream=True)
    seen = []
    with pytest.raises(AdapterError) as raised:
        async for c in adapter_on(server.url).stream(call):
            seen.append(c)
    assert seen == [{"id": "c", "choices": []}, chunk]
    assert raised.value.code == ErrorCode.CONNECTION


async def test_a_refused_connection_is_a_connection_error(upstream, adapter):
    upstream.close()
    with pytest.raises(AdapterError) as raised:
        await adapter.health()
    assert raised.value.code == ErrorCode.CONNECTION


Answer = Callable[[socket.socket], None]


@pytest.fixture
def raw_server() -> Iterator[Callable[[Answer], str]]:
    """Starts TCP servers on 127.0.0.1 that read each request and leave the connection to
    the test's `answer` (then close it): for answers no HTTP server of ours would send."""
    listeners: list[socket.socket] = []

    def start(answer: Answer) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:  # closed: the test is over
                    return
                with conn:
                    conn.recv(65536)
                    answer(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener in listeners:
        listener.close()


@pytest.mark.parametrize(
    "answer, named",
    [
        (b"", "the server closed the connection before its answer ended (ServerDisconnected"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "the server's answer is not HTTP (ClientResponseError"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{",
            "the server closed the connection before its answer ended (ClientPayloadError",
        ),
    ],
)
async def test_a_dropped_or_garbled_answer_is_a_connection_error_that_says_so(
    raw_server, adapter_on, answer, named
):
    """Whatever the connection's failure, a call ends in one error the runtime knows, and the
    message says what happened in plain words, then names it (not by the name the transport
    files it under)."""
    url = raw_server(lambda conn: conn.sendall(answer))
    with pytest.raises(AdapterError) as raised:
        await adapter_on(url).run(InferenceCall("chat", "m", CHAT))
    assert raised.value.code == ErrorCode.CONNECTION
    assert raised.value.message.startswith(named)


async def test_a_server_nobody_listens_on_is_said_plainly(adapter_on):
    with pytest.raises(AdapterError) as raised:
        await adapter_on(f"http://127.0.0.1:{free_port()}").run(InferenceCall("chat", "m", CHAT))
    assert raised.value.code == ErrorCode.CONNECTION
    assert raised.value.message.startswith("could not connect to the server (")


async def test_a_stream_given_up_closes_its_connection(raw_server, adapter_on):
    """A stream the worker stops reading (its task cancelled, the caller gone) must not go
    back to the pool half read: closing the connection is what stops the server's work."""
    closed = threading.Event()

    def still_generating(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        data = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))  # and no end of the body
        conn.settimeout(10)
        if conn.recv(1) == b"":
            closed.set()

    call = InferenceCall("chat", "m", {**CHAT, "stream": True}, stream=True)
    stream = adapter_on(raw_server(still_generating)).stream(call)
    first = await anext(stream)
    await stream.aclose()
    assert first["choices"][0]["delta"]["content"] == "a"
    assert await asyncio.to_thread(closed.wait, 10)


async def test_retry_after_ms_is_read(server, adapter_on):
    server.on(
        "POST",
        "/v1/embeddings",
        Reply(429, {"error": {"message": "slow"}}, {"retry-after-ms": "250"}),
    )
    with pytest.raises(AdapterError) as raised:
        await adapter_on(server.url).run(InferenceCall("embedding", "m", {"input": "x"}))
    assert (raised.value.code, raised.value.retry_after_s) == (ErrorCode.BUSY, 0.25)


async def test_a_base_url_with_a_path_keeps_it(server, adapter_on):
    """A server behind a reverse proxy (`http://gpu-box/llama/`): every call goes under its
    base URL's path, as the operator wrote it."""
    server.on("POST", "/llama/v1/chat/completions", Reply(200, {"choices": []}))
    server.on("GET", "/llama/v1/models", Reply(200, {"data": [{"id": "m"}]}))
    adapter = adapter_on(server.url + "/llama/")
    assert await adapter.run(InferenceCall("chat", "m", CHAT)) == {"choices": []}
    assert [m.id for m in await adapter.list_models()] == ["m"]
    assert server.calls() == [("POST", "/llama/v1/chat/completions"), ("GET", "/llama/v1/models")]


RESPONSE_EVENTS = [
    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
    {"type": "response.output_text.delta", "delta": "Hi"},
    {"type": "response.completed", "response": {"id": "resp_1", "object": "response"}},
]


async def test_the_adapter_ends_a_response_stream_at_its_last_event(server, adapter_on):
    """No [DONE]: the stream is over at `response.completed`; a failed response raises."""
    server.on("POST", "/v1/responses", Stream(sse(*RESPONSE_EVENTS, done=False)))
    call = InferenceCall("response", "m", {"input": "hi", "stream": True}, stream=True)
    assert [e async for e in adapter_on(server.url).stream(call)] == RESPONSE_EVENTS
    assert server.seen[-1].body["model"] == "m"

    failed = {"type": "response.failed", "response": {"error": {"message": "out of memory"}}}
    server.on("POST", "/v1/responses", Stream(sse(RESPONSE_EVENTS[0], failed, done=False)))
    with pytest.raises(AdapterError) as raised:
        async for _ in adapter_on(server.url).stream(call):
            pass
    assert (raised.value.code, raised.value.message) == (ErrorCode.LOAD_FAILED, "out of memory")

"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests: instant answers, SSE
streaming, a record of every request, failures on demand, and a gate that holds answers
(noticing a caller that hangs up meanwhile)."""

import select
import socket
import threading
import time
from typing import Any

from tests.support.local_server import Handler, LocalServer


class Upstream(LocalServer):
    def __init__(self, models: list[str]) -> None:
        self.models = list(models)
        self.received: list[dict[str, Any]] = []
        self.fail_next: list[tuple[int, str]] = []  # (status, message) served in order
        self.gate: threading.Event | None = None  # when set: inference waits for it
        self.arrived = threading.Event()
        self.hung_up = threading.Event()  # a caller held at the gate closed its connection
        self.dropped: list[dict[str, Any]] = []  # the bodies of those calls
        self.chunked_streams = False  # streams end without closing the connection
        self.reply_headers: dict[str, str] = {}  # sent with every non-streamed answer
        super().__init__()

    def handler(self) -> type[Handler]:
        upstream = self

        class UpstreamHandler(Handler):
            def held_at_gate(self, gate: threading.Event) -> bool:
                """Wait for `gate` (30 s at most); False as soon as the caller hangs up."""
                deadline = time.monotonic() + 30
                while not gate.is_set() and time.monotonic() < deadline:
                    # Readable with nothing to read: the caller closed its end.
                    readable, _, _ = select.select([self.connection], [], [], 0.05)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        return False
                return True

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self.send_json(200, model_list(upstream.models))
                else:
                    self.send_json(404, {"error": {"message": "no route"}})

            def do_POST(self) -> None:
                body = self.read_json()
                upstream.received.append(
                    {
                        "path": self.path,
                        "body": body,
                        "headers": self.headers_seen(),
                        "peer": self.client_address,
                    }
                )
                upstream.arrived.set()
                if upstream.gate is not None and not self.held_at_gate(upstream.gate):
                    upstream.dropped.append(body)
                    upstream.hung_up.set()  # as a server stops generating: nothing is sent
                    return
                if upstream.fail_next:
                    status, message = upstream.fail_next.pop(0)
                    self.send_json(status, {"error": {"message": message}})
                    return
                if body.get("model") not in upstream.models:
                    self.send_json(
                        404, {"error": {"message": f"model {body.get('model')} not found"}}
                    )
                    return
                if self.path == "/v1/embeddings":
                    self.send_json(
                        200,
                        {
                            "object": "list",
                            "model": body["model"],
                            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                            "usage": {"prompt_tokens": 1, "total_tokens": 1},
                        },
                    )
                elif body.get("stream"):
                    usage = (body.get("stream_options") or {}).get("include_usage", False)
                    chunks = stream_chunks(body["model"], usage)
                    self.send_sse(chunks, keep_alive=upstream.chunked_streams)
                else:
                    self.send_json(200, reply(self.path, body), upstream.reply_headers)

        return UpstreamHandler

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()  # a request held at the gate finishes rather than wait out its timeout
        super().close()


def model_list(models: list[str]) -> dict:
    """The answer to `GET /v1/models`."""
    data = [{"id": m, "object": "model", "owned_by": "test"} for m in models]
    return {"object": "list", "data": data}


def stream_chunks(model: str, usage: bool = False) -> list[dict]:
    """A streamed chat answer: "Hello from upstream" word by word, then the finish chunk;
    with `usage` (`stream_options.include_usage`), then the usage-only chunk, as OpenAI."""
    head = {"id": "up-1", "object": "chat.completion.chunk", "created": 0, "model": model}
    words = [
        {**head, "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        for word in ("Hello", " from", " upstream")
    ]
    done = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    counted = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    return [*words, done] + ([{**head, "choices": [], "usage": counted}] if usage else [])


def reply(path: str, body: dict) -> dict:
    if path == "/v1/completions":
        return {
            "id": "up-1",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "text": "Hello from upstream", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        }
    return {
        "id": "up-1",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from upstream"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
    }

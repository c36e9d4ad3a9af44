"""What the HTTP servers the tests run on 127.0.0.1 share: a request handler that reads and
writes JSON and SSE, and a server that serves one on a thread of its own and can be closed
(also as a `with` block) and started again on the same port."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import httpx


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the servers the adapters talk to

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line a request would bury the test output

    def headers_seen(self) -> httpx.Headers:
        """The request's headers, every one kept, found by name in any case (as on the wire)."""
        return httpx.Headers(list(self.headers.items()))

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def read_json(self) -> Any:
        return json.loads(self.read_body() or b"{}")

    def send_body(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_body(status, json.dumps(body).encode(), "application/json", headers)

    def send_sse(self, events: list[Any], done: bool = True, keep_alive: bool = False) -> None:
        """`data:` messages and, with `done`, `data: [DONE]`; then the connection closes
        (without `done` that is a stream cut short). With `keep_alive`, the body is chunked
        and its end keeps the connection open, as llama-server and vLLM send theirs."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if keep_alive:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        messages = [f"data: {json.dumps(event)}\n\n".encode() for event in events]
        if done:
            messages.append(b"data: [DONE]\n\n")
        for message in messages:
            self.wfile.write(chunk(message) if keep_alive else message)
            self.wfile.flush()
        if keep_alive:
            self.wfile.write(chunk(b""))  # the end of the body
        else:
            self.close_connection = True


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (empty: the body's end)."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class LocalServer:
    """Serves `handler()` on 127.0.0.1 from `__init__` on. Subclasses set their own state
    before calling `super().__init__()`, since requests may arrive from then on."""

    def __init__(self) -> None:
        self.port = 0  # the first start picks a free port; later starts reuse it
        self.httpd: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handler(self) -> type[Handler]:
        raise NotImplementedError

    def start(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        # A short poll so that close() returns at once rather than after up to half a second.
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()

    def close(self) -> None:
        """Close the port: connections are refused until `start()`. Closing twice is fine."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A real OpenAI-compatible HTTP server on 127.0.0.1 whose every answer can fail on demand,
including the model list (which the openai adapter's load and every status sync read). It
can go away and come back on the same port, to play an unreachable server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.openai_upstream import reply


class FlakyUpstream:
    def __init__(self, models: list[str]) -> None:
        self.models = list(models)
        self.fail_listing: list[tuple[int, str]] = []  # (status, message) served in order
        self.fail_next: list[tuple[int, str]] = []  # the same, for inference
        self.listing_gate: threading.Event | None = None  # when set: listing waits for it
        self.cut_streams = 0  # this many streamed answers stop after their first chunk
        self.inferences = 0
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Close the port: connections are refused until `start()`."""
        if self.listing_gate is not None:
            self.listing_gate.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def send_json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def fail_from(self, script: list[tuple[int, str]]) -> bool:
                if not script:
                    return False
                status, message = script.pop(0)
                self.send_json(status, {"error": {"message": message}})
                return True

            def do_GET(self) -> None:
                if upstream.listing_gate is not None:
                    upstream.listing_gate.wait(timeout=30)
                if self.fail_from(upstream.fail_listing):
                    return
                data = [{"id": m, "object": "model"} for m in upstream.models]
                self.send_json(200, {"object": "list", "data": data})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                upstream.inferences += 1
                if self.fail_from(upstream.fail_next):
                    return
                if body.get("stream"):
                    self.stream(body)
                else:
                    self.send_json(200, reply(self.path, body))

            def stream(self, body: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                words = ["Hello", " from", " upstream"]
                if upstream.cut_streams:
                    upstream.cut_streams -= 1
                    words = words[:1]  # then the connection drops: no [DONE]
                for word in words:
                    delta = {"index": 0, "delta": {"content": word}, "finish_reason": None}
                    chunk = {"object": "chat.completion.chunk", "choices": [delta]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if len(words) == 3:
                    self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler

"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests: instant answers, SSE
streaming, a record of every request, and failures on demand."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Upstream:
    def __init__(self, models: list[str]) -> None:
        self.models = list(models)
        self.received: list[dict[str, Any]] = []
        self.fail_next: list[tuple[int, str]] = []  # (status, message) served in order
        self.gate: threading.Event | None = None  # when set: inference waits for it
        self.arrived = threading.Event()
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

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    data = [
                        {"id": m, "object": "model", "owned_by": "test"} for m in upstream.models
                    ]
                    self.send_json(200, {"object": "list", "data": data})
                else:
                    self.send_json(404, {"error": {"message": "no route"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                upstream.received.append(
                    {"path": self.path, "body": body, "headers": dict(self.headers)}
                )
                upstream.arrived.set()
                if upstream.gate is not None:
                    upstream.gate.wait(timeout=30)
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
                    self.stream(body)
                else:
                    self.send_json(200, reply(self.path, body))

            def stream(self, body: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for word in ("Hello", " from", " upstream"):
                    delta = {
                        "id": "up-1",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "delta": {"content": word}, "finish_reason": None}
                        ],
                    }
                    self.wfile.write(f"data: {json.dumps(delta)}\n\n".encode())
                    self.wfile.flush()
                last = {
                    "id": "up-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                }
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.server.shutdown()
        self.server.server_close()


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

"""A real HTTP server on 127.0.0.1 that plays llama-swap (see backend-apis.md): models start
on `GET /upstream/<model>/health`, `/running` lists what runs, `POST /api/models/unload/<m>`
stops one. It has room for `room` models at once; a load beyond that fails the way an
out-of-memory upstream does, and loads can also fail on demand."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from tests.support.openai_upstream import reply


class SwapUpstream:
    def __init__(self, models: list[str], room: int = 1) -> None:
        self.models = list(models)
        self.room = room
        self.running: list[str] = []
        self.fail_loads: list[tuple[int, str]] = []  # (status, message) served in order
        self.loads: list[str] = []  # every load asked for, in order
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

            def swap_error(self, status: int, message: str) -> None:
                self.send_json(status, {"error": message, "src": "llama-swap"})

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    data = [{"id": m, "object": "model"} for m in upstream.models]
                    self.send_json(200, {"object": "list", "data": data})
                elif self.path == "/running":
                    running = [{"model": m, "state": "ready"} for m in upstream.running]
                    self.send_json(200, {"running": running})
                elif self.path == "/health":
                    self.send_json(200, {"status": "ok"})
                elif self.path.startswith("/upstream/") and self.path.endswith("/health"):
                    self.load(unquote(self.path[len("/upstream/") : -len("/health")]))
                else:
                    self.send_json(404, {"error": "no route"})

            def load(self, model: str) -> None:
                upstream.loads.append(model)
                if model not in upstream.models:
                    self.swap_error(404, f"could not find suitable handler for {model}")
                elif upstream.fail_loads:
                    self.swap_error(*upstream.fail_loads.pop(0))
                elif model not in upstream.running and len(upstream.running) >= upstream.room:
                    self.swap_error(502, f"upstream {model} exited: CUDA out of memory")
                else:
                    if model not in upstream.running:
                        upstream.running.append(model)
                    self.send_json(200, {"status": "ok"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.startswith("/api/models/unload/"):
                    model = unquote(self.path[len("/api/models/unload/") :])
                    if model in upstream.running:
                        upstream.running.remove(model)
                    self.send_json(200, {"status": "ok"})
                elif body.get("model") in upstream.running:
                    self.send_json(200, reply(self.path, body))
                else:
                    self.swap_error(502, f"{body.get('model')} is not running")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

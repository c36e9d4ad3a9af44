"""A real HTTP server on 127.0.0.1 that plays llama-swap (see backend-apis.md): models start
on `GET /upstream/<model>/health`, `/running` lists what runs, `POST /api/models/unload/<m>`
stops one. It has room for `room` models at once; a load beyond that fails the way an
out-of-memory upstream does, and loads can also fail on demand."""

from urllib.parse import unquote

from tests.support.local_server import Handler, LocalServer
from tests.support.openai_upstream import model_list, reply


class SwapUpstream(LocalServer):
    def __init__(self, models: list[str], room: int = 1) -> None:
        self.models = list(models)
        self.room = room
        self.running: list[str] = []
        self.fail_loads: list[tuple[int, str]] = []  # (status, message) served in order
        self.loads: list[str] = []  # every load asked for, in order
        super().__init__()

    def handler(self) -> type[Handler]:
        upstream = self

        class SwapHandler(Handler):
            def swap_error(self, status: int, message: str) -> None:
                self.send_json(status, {"error": message, "src": "llama-swap"})

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self.send_json(200, model_list(upstream.models))
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
                body = self.read_json()
                if self.path.startswith("/api/models/unload/"):
                    model = unquote(self.path[len("/api/models/unload/") :])
                    if model in upstream.running:
                        upstream.running.remove(model)
                    self.send_json(200, {"status": "ok"})
                elif body.get("model") in upstream.running:
                    self.send_json(200, reply(self.path, body))
                else:
                    self.swap_error(502, f"{body.get('model')} is not running")

        return SwapHandler

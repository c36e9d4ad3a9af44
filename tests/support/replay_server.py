"""A real HTTP server on 127.0.0.1 that replays scripted answers, for the servers we cannot
run in tests (LM Studio, Ollama, llama-swap, vLLM, Lemonade, llama-server modes).

Script it with `on(method, path, *replies)`: the replies are served in order, the last one
again for every later request. Every request is recorded (method, path, query, JSON body,
headers) so a test can assert on exactly what an adapter sent. A `Stream` reply can hold its
body back until a given request has arrived (an SSE listener that must see events only after
the load call), which keeps tests free of sleeps.
"""

import json
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.support.local_server import Handler, LocalServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # dict/list → JSON; str → text; None → empty
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stream:
    """A chunked body written piece by piece: SSE (`sse(...)`) or NDJSON (`ndjson(...)`)."""

    pieces: list[str]
    content_type: str = "text/event-stream"
    status: int = 200
    after: tuple[str, str] | None = None  # (method, path) to wait for before writing
    hold_open: bool = False  # keep the connection open after the pieces (long-lived SSE)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: httpx.Headers  # names match in any case, as on the wire


def sse(*events: Any, done: bool = True, named: list[str] | None = None) -> list[str]:
    """`data: <json>` messages (with `event:` lines when `named`), then `data: [DONE]`."""
    pieces = []
    for i, event in enumerate(events):
        data = event if isinstance(event, str) else json.dumps(event)
        prefix = f"event: {named[i]}\n" if named else ""
        pieces.append(f"{prefix}data: {data}\n\n")
    if done:
        pieces.append("data: [DONE]\n\n")
    return pieces


def ndjson(*objects: Any) -> list[str]:
    return [json.dumps(o) + "\n" for o in objects]


class ReplayServer(LocalServer):
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Reply | Stream]] = {}
        self.seen: list[Seen] = []
        self.changed = threading.Condition()
        self.closing = threading.Event()
        super().__init__()

    def handler(self) -> type[Handler]:
        replay = self

        class ReplayHandler(Handler):
            def handle_any(self) -> None:
                url = urlsplit(self.path)
                raw = self.read_body()
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode()
                seen = Seen(self.command, url.path, parse_qs(url.query), body, self.headers_seen())
                reply = replay.record(seen)
                if isinstance(reply, Stream):
                    self.write_stream(reply)
                else:
                    self.write_reply(reply)

            do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = handle_any

            def write_reply(self, reply: Reply) -> None:
                if isinstance(reply.body, dict | list):
                    data, ctype = json.dumps(reply.body).encode(), "application/json"
                elif isinstance(reply.body, str):
                    data, ctype = reply.body.encode(), "text/plain; charset=utf-8"
                else:
                    data, ctype = b"", "text/plain"
                self.send_body(reply.status, data, ctype, reply.headers)

            def write_stream(self, reply: Stream) -> None:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if reply.after:
                    replay.wait_for(*reply.after)
                try:
                    for piece in reply.pieces:
                        data = piece.encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    if reply.hold_open:
                        replay.closing.wait(timeout=30)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped listening, as SSE clients do
                self.close_connection = True

        return ReplayHandler

    def on(self, method: str, path: str, *replies: Reply | Stream) -> None:
        self.routes[(method, path)] = list(replies)

    def record(self, seen: Seen) -> Reply | Stream:
        with self.changed:
            self.seen.append(seen)
            self.changed.notify_all()
            replies = self.routes.get((seen.method, seen.path))
            if not replies:
                return Reply(404, {"error": {"message": f"unscripted {seen.method} {seen.path}"}})
            return replies.pop(0) if len(replies) > 1 else replies[0]

    def wait_for(self, method: str, path: str) -> None:
        with self.changed:
            self.changed.wait_for(
                lambda: any(s.method == method and s.path == path for s in self.seen), timeout=30
            )

    def calls(self) -> list[tuple[str, str]]:
        return [(s.method, s.path) for s in self.seen]

    def requests_to(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path == path]

    def body_of(self, method: str, path: str) -> Any:
        """The JSON body of the only request to this route."""
        found = self.requests_to(method, path)
        assert len(found) == 1, f"{len(found)} requests to {method} {path}: {self.calls()}"
        return found[0].body

    def close(self) -> None:
        self.closing.set()  # held-open streams end with the server
        super().close()

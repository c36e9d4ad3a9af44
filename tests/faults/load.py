"""The callers of a fault scenario, the upstream it faults, and the audit that ends it."""

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import httpx

from tests.support.local_server import Handler, LocalServer

TERMINAL = ("completed", "failed", "cancelled", "expired")
WORDS = ["Fault", " suite", " reply", "."]


class FaultyUpstream(LocalServer):
    """An OpenAI-compatible server that counts each caller's marker and fails on demand:
    `mode` "ok", "500", "stall" (answers once `released` is set) or "cut" (a stream stops
    after its first chunk, as when its model is unloaded under it); `close()` refuses."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.released = threading.Event()
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()
        super().__init__()

    def handler(self) -> type[Handler]:
        upstream = self

        class FaultyHandler(Handler):
            def do_GET(self) -> None:
                models = {"object": "list", "data": [{"id": "m1-up", "object": "model"}]}
                self.send_json(200, models)

            def do_POST(self) -> None:
                body = self.read_json()
                marker = body["messages"][0]["content"]
                with upstream.lock:
                    upstream.hits[marker] += 1
                mode = upstream.mode
                if mode == "500":
                    self.send_json(500, {"error": {"message": "upstream fault"}})
                    return
                if mode == "stall":
                    upstream.released.wait(timeout=60)
                head = {"id": "f", "created": 0, "model": body["model"]}
                if not body.get("stream"):
                    time.sleep(0.02)
                    message = {"role": "assistant", "content": "".join(WORDS)}
                    choice = {"index": 0, "message": message, "finish_reason": "stop"}
                    reply = head | {"object": "chat.completion", "choices": [choice]}
                    self.send_json(200, reply)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i, word in enumerate(WORDS):
                    delta = {"index": 0, "delta": {"content": word}, "finish_reason": None}
                    chunk = head | {"object": "chat.completion.chunk", "choices": [delta]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    if mode == "cut" and i == 0:
                        self.close_connection = True
                        return
                    time.sleep(0.03)
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        return FaultyHandler


@dataclass
class Outcome:
    marker: str
    stream: bool
    status: int | None = None
    request_id: str | None = None
    code: str | None = None  # the error's, in the body or in the stream
    ended: bool = True  # a stream's last event was [DONE]
    text: str = ""
    transport: str | None = None  # the connection failed
    seconds: float = 0.0
    ended_at: float = 0.0  # wall clock, to compare with the row's finished_at


@dataclass
class Load:
    """Callers that each send one request after another to the web processes in turn,
    from a thread of their own, until stopped."""

    urls: list[str]
    callers: int = 8
    jobs: bool = False  # POST /api/v1/requests (202 at once) instead of chat completions
    total: int | None = None  # calls in all, then the callers stop by themselves
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> "Load":
        self.thread = threading.Thread(target=lambda: asyncio.run(self.run()), daemon=True)
        self.thread.start()
        return self

    def finish(self) -> list[Outcome]:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "callers still waiting two minutes after the end"
        return self.outcomes

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.outcomes) < count:
            answers = Counter((o.status, o.code, o.transport) for o in self.outcomes)
            assert time.monotonic() < deadline, f"fewer than {count} calls answered: {answers}"
            time.sleep(0.05)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.callers * 2)
        async with httpx.AsyncClient(timeout=90, limits=limits) as client:
            await asyncio.gather(*(self.caller(client, i) for i in range(self.callers)))

    async def caller(self, client: httpx.AsyncClient, n: int) -> None:
        while not self.stop.is_set():
            if self.total is not None:
                if self.total <= 0:
                    return
                self.total -= 1  # one event loop: no other caller runs meanwhile
            url = self.urls[n % len(self.urls)]
            if self.jobs:
                self.outcomes.append(await submit(client, url))
            else:
                self.outcomes.append(await call(client, url, stream=n % 2 == 0))


async def call(client: httpx.AsyncClient, url: str, stream: bool) -> Outcome:
    marker = uuid.uuid4().hex
    body = {"model": "m1", "messages": [{"role": "user", "content": marker}], "stream": stream}
    out = Outcome(marker, stream)
    started = time.monotonic()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            out.status = response.status_code
            out.request_id = response.headers.get("x-request-id")
            if not stream or response.status_code != 200:
                raw = await response.aread()
                read_answer(out, raw)
            else:
                await read_stream(out, response)
    except httpx.HTTPError as exc:
        out.transport = type(exc).__name__
    out.seconds = time.monotonic() - started
    out.ended_at = time.time()
    return out


async def submit(client: httpx.AsyncClient, url: str) -> Outcome:
    """A job: 202 and its id at once (or 429 `queue_full`); the answer stays on its row."""
    marker = uuid.uuid4().hex
    body = {"model": "m1", "messages": [{"role": "user", "content": marker}]}
    out = Outcome(marker, stream=False)
    started = time.monotonic()
    try:
        response = await client.post(f"{url}/api/v1/requests", json={"body": body})
        out.status = response.status_code
        data = response.json()
        if "error" in data:
            out.code = data["error"].get("code")
        out.request_id = data.get("id")
    except (httpx.HTTPError, ValueError) as exc:
        out.transport = type(exc).__name__
    out.seconds = time.monotonic() - started
    out.ended_at = time.time()
    return out


def read_answer(out: Outcome, raw: bytes) -> None:
    try:
        data = json.loads(raw)
    except ValueError:
        out.code = "not json"
        return
    if "error" in data:
        out.code = data["error"].get("code")
    else:
        out.text = data["choices"][0]["message"]["content"]


async def read_stream(out: Outcome, response: httpx.Response) -> None:
    last = None
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        last = line[6:]
        if last == "[DONE]":
            continue
        event = json.loads(last)
        if "error" in event:
            out.code = event["error"].get("code")
        for choice in event.get("choices") or []:
            out.text += (choice.get("delta") or {}).get("content") or ""
    out.ended = last == "[DONE]"


@dataclass
class Audit:
    """What the scenario's rows and callers tell, and what was wrong with them."""

    name: str
    outcomes: list[Outcome]
    rows: dict[str, tuple[str, str, int]]  # marker -> (id, state, attempts)
    hits: Counter
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        states = Counter(state for _, state, _ in self.rows.values())
        answers = Counter(
            f"{o.status}{' ' + o.code if o.code else ''}" if o.status else o.transport
            for o in self.outcomes
        )
        slowest = max((o.seconds for o in self.outcomes), default=0)
        return (
            f"{self.name}: {len(self.outcomes)} calls, {len(self.rows)} rows"
            f" {dict(states)}; answers {dict(answers)}; slowest {slowest:.2f} s;"
            f" problems {len(self.problems)}"
        )


def audit(name: str, outcomes: list[Outcome], query, hits: Counter) -> Audit:
    """Every accepted request in one terminal state; none run twice unless its attempts say
    so; every caller's answer consistent with its row; every stream ended."""
    rows = {
        marker: (str(rid), state, attempts)
        for rid, state, attempts, marker in query(
            "SELECT id, state, attempts, payload->'messages'->0->>'content' FROM scheduler_request"
        )
    }
    found = Audit(name, outcomes, rows, hits)
    per_marker = Counter(
        m for (m,) in query("SELECT payload->'messages'->0->>'content' FROM scheduler_request")
    )
    for marker, count in per_marker.items():
        if count > 1:
            found.problems.append(f"{marker}: stored {count} times")
    # A request whose worker stopped runs again, as documented, and its trace says so.
    reruns = Counter(
        str(rid)
        for (rid,) in query(
            "SELECT request_id FROM scheduler_trace WHERE reason LIKE '%%will run again%%'"
        )
    )
    for marker, (rid, state, attempts) in rows.items():
        if state not in TERMINAL:
            found.problems.append(f"{rid}: left {state}")
        if hits[marker] > max(attempts, 1) + reruns[rid]:
            found.problems.append(f"{rid}: run {hits[marker]} times in {attempts} attempts")
    for out in outcomes:
        row = rows.get(out.marker)
        state = row[1] if row else None
        if out.transport:
            found.problems.append(f"{out.marker}: the connection failed ({out.transport})")
        elif out.stream and out.status == 200 and not out.ended:
            found.problems.append(f"{out.request_id}: a stream without an end")
        elif out.status == 200 and (state != "completed" or out.code):
            if not (out.stream and out.code and state in ("failed", "expired", "cancelled")):
                found.problems.append(f"{out.request_id}: answered 200 ({out.code}), row {state}")
        elif (out.status or 0) >= 500 and state == "completed" and not_unknown(out):
            found.problems.append(f"{out.request_id}: {out.status} {out.code}, completed")
        if out.code in ("unavailable", "queue_full") and row is not None:
            found.problems.append(f"{out.marker}: {out.status} {out.code}, yet stored")
        if out.status == 202 and state != "completed":
            found.problems.append(f"{out.request_id}: a job accepted, its row {state}")
        if out.status == 200 and state == "completed" and out.text != "".join(WORDS):
            found.problems.append(f"{out.request_id}: the answer is {out.text!r}")
    return found


def not_unknown(out: Outcome) -> bool:
    """A 5xx other than `request_state_unknown` (which says the row may complete)."""
    return out.code != "request_state_unknown"

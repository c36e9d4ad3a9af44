"""A worker's own health, for its supervisor: `run_scheduler --health-port N` answers
`GET /healthz` with 200 while its loop is alive and a pass ended recently, else 503 (also
while its passes fail: `runtime.failing_passes`).

A pass is due at least every poll interval (the safety net), so a loop that has not ended
one within twice that (and at least a second, for a pass's own time) is stuck or dead. The
answer is JSON, from a tiny HTTP server on the worker's own event loop: a loop that is
blocked cannot answer at all, which a supervisor reads as unhealthy too."""

import asyncio
import json
import logging
import time

from django.conf import settings

from .runtime import Runtime

log = logging.getLogger(__name__)


class WorkerHealth:
    def __init__(self, runtime: Runtime | None = None) -> None:
        self.runtime = runtime  # the worker's current one (`follow`)
        self.last_pass: float | None = None  # monotonic
        self.serving = False
        self.watching: asyncio.Task | None = None

    def follow(self, runtime: Runtime) -> None:
        """Watch `runtime` from now on (a worker starts a new one after a database fault)."""
        self.runtime = runtime
        self.watch_current()

    def watch_current(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
        if self.serving and self.runtime is not None:
            self.watching = asyncio.create_task(self.watch(self.runtime))

    @property
    def stale_s(self) -> float:
        return max(2 * settings.SWITCHYARD["POLL_INTERVAL_S"], 1.0)

    def state(self) -> tuple[int, dict]:
        rt = self.runtime
        if rt is None or self.last_pass is None:
            worker, passes = (rt.worker_id, rt.passes) if rt else (None, 0)
            return 503, {"status": "starting", "worker": worker, "passes": passes}
        age = time.monotonic() - self.last_pass
        failing = rt.failing.since is not None
        healthy = age <= self.stale_s and not failing
        body = {
            "status": "ok" if healthy else "failing" if failing else "stalled",
            "worker": rt.worker_id,
            "passes": rt.passes,
            "last_pass_age_s": round(age, 3),
            "stale_after_s": self.stale_s,
        }
        if failing:
            body |= {"failed_passes": rt.failing.count, "error": rt.failing.error}
        return (200 if healthy else 503), body

    async def watch(self, rt: Runtime) -> None:
        """Note the time of every pass the loop ends."""
        while True:
            async with rt.passed:
                seen = rt.passes
                await rt.passed.wait_for(lambda seen=seen: rt.passes != seen)
            self.last_pass = time.monotonic()

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                line = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # the headers: nothing in them matters
            parts = line.split()
            if len(parts) >= 2 and parts[0] == b"GET" and parts[1] == b"/healthz":
                status, body = self.state()
            else:
                status, body = 404, {"error": "only GET /healthz is served here"}
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(self, host: str, port: int) -> None:
        """Serve until cancelled."""
        self.serving = True
        self.watch_current()
        server = await asyncio.start_server(self.answer, host, port)
        log.info("worker health on http://%s:%s/healthz", host, port)
        try:
            async with server:
                await server.serve_forever()
        finally:
            self.serving = False
            self.watch_current()

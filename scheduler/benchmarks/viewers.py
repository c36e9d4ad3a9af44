"""Open dashboards during a scenario: a staff user signs in over HTTP, then `n` websockets
follow /ws/dashboard/ as a browser does, counting what each one receives."""

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import httpx
from django.contrib.auth.models import User

from .stack import BENCH

USER, PASSWORD = "bench-operator", "bench-operator-password"


def staff_cookies(base_url: str) -> dict[str, str]:
    """Sign in through the admin's login form, as an operator's browser does."""
    if not User.objects.using(BENCH).filter(username=USER).exists():
        User.objects.db_manager(BENCH).create_superuser(USER, "bench@example.com", PASSWORD)
    with httpx.Client(base_url=base_url) as client:
        client.get("/admin/login/")
        response = client.post(
            "/admin/login/?next=/",
            data={
                "username": USER,
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
                "next": "/",
            },
            headers={"Referer": f"{base_url}/admin/login/"},
        )
        if "sessionid" not in client.cookies:
            raise RuntimeError(f"the bench could not sign in: {response.status_code}")
        return dict(client.cookies)


@dataclass
class Watching:
    """Dashboards open in a thread of their own until `close()`; then what they received."""

    base_url: str
    n: int
    messages: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.cookies = staff_cookies(self.base_url)
        self.stop = threading.Event()
        self.opened = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.watch()), daemon=True)
        self.thread.start()
        if not self.opened.wait(30):
            raise RuntimeError("the dashboards did not connect")

    async def watch(self) -> None:
        url = self.base_url.replace("http://", "ws://") + "/ws/dashboard/"
        # Each dashboard's pushes from when all are open until the end (a page's first
        # state, sent as it connects, is not a push).
        counts = [0] * self.n
        began = ended = float("inf")
        async with aiohttp.ClientSession(cookies=self.cookies) as session:
            sockets = [await session.ws_connect(url, origin=self.base_url) for _ in range(self.n)]

            async def read(i: int, ws) -> None:
                async for message in ws:
                    if began <= time.monotonic() <= ended:
                        counts[i] += 1
                    self.sizes.append(len(message.data))

            readers = [asyncio.create_task(read(i, ws)) for i, ws in enumerate(sockets)]
            began = time.monotonic()
            self.opened.set()
            while not self.stop.is_set():
                await asyncio.sleep(0.1)  # a poll of the main thread's flag, not a wait on work
            ended = time.monotonic()
            self.seconds = ended - began
            for ws in sockets:
                await ws.close()
            await asyncio.gather(*readers, return_exceptions=True)
        self.messages = counts
        # Intervals a second: a limit of one push an interval lets a window of W seconds
        # hold W / interval + 1 pushes (61 in 15.2 s at exactly 4 a second), and a push
        # that reached the page late moves the ends of a span measured between pushes.
        self.rates = [max(n - 1, 0) / self.seconds for n in counts]

    def close(self) -> dict[str, float | int | None]:
        self.stop.set()
        self.thread.join(30)
        per_s = self.rates
        return {
            "dashboards": self.n,
            "seconds": round(self.seconds, 1),
            "messages_per_dashboard_per_s": round(sum(per_s) / len(per_s), 2) if per_s else None,
            "max_messages_per_dashboard_per_s": round(max(per_s), 2) if per_s else None,
            "message_kb_avg": round(sum(self.sizes) / len(self.sizes) / 1024, 1)
            if self.sizes
            else None,
        }


def with_dashboards(
    base_url: str,
    n: int,
    probe: Callable[[], list],
    cpu: Callable[[], dict],
    worker: str,
    min_s: float = 10.0,
) -> dict:
    """Probe alone and with `n` dashboards open (each for at least `min_s`): what they
    received, and the CPU a second of probing of the worker and of the web process without
    and with them (a probe row's [4] is its dispatch p50 in ms)."""

    def timed() -> tuple[list, dict[str, float]]:
        began, t0 = cpu(), time.monotonic()
        row = probe()
        while time.monotonic() - t0 < min_s:
            row = probe()
        ended, seconds = cpu(), time.monotonic() - t0
        return row, {k: (ended[k] - began[k]) / seconds for k in ("web", worker) if k in began}

    alone, alone_cpu = timed()
    watching = Watching(base_url, n)
    viewed, viewed_cpu = timed()
    per_viewer = watching.close()
    worker_ratio = (
        round(viewed_cpu[worker] / alone_cpu[worker], 2) if alone_cpu.get(worker) else None
    )
    return per_viewer | {
        "cpu_per_s_without": {k: round(v, 3) for k, v in alone_cpu.items()},
        "cpu_per_s_with": {k: round(v, 3) for k, v in viewed_cpu.items()},
        "worker_cpu_ratio": worker_ratio,
        "dispatch_p50_ms_without": alone[4],
        "dispatch_p50_ms_with": viewed[4],
    }

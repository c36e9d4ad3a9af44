"""The load generator, in its own process so that its CPU never counts against Switchyard:
`python -m scheduler.benchmarks.loadgen results.json < phases.json` (to a file, not to
stdout: a library's stray write there would corrupt the results).

The input is a list of phases run one after the other (one process start for a whole
scenario). A phase is `{"base_url": ..., "warmup": n, "groups": [group, ...]}`; its groups
run at the same time.
A group is closed-loop (`concurrency` callers, each sending its next request when the last
one finished) unless it has `interval_s` (one arrival every interval) or `arrivals` (a list of
`{"at": s, ...overrides}`). It stops after `count` requests or `duration_s`, whichever first.
Every request records wall-clock start, first byte, first data event, end, status, id.
It is sent with the API key `api_key` of its group, else SWITCHYARD_API_KEY of the
environment (`Authorization: Bearer`).
"""

import asyncio
import json
import os
import sys
import time
from typing import Any

import aiohttp
import httpx

from backends.adapters.http import transport
from config import event_loop

PATHS = {"chat": "/v1/chat/completions", "embedding": "/v1/embeddings"}


def auth_headers(key: str | None = None) -> dict[str, str]:
    """The bench's key (`key`, else SWITCHYARD_API_KEY) as a Bearer header."""
    key = key or os.environ.get("SWITCHYARD_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _body(req: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req["model"]}
    if req.get("kind") == "embedding":
        body["input"] = "bench"
    else:
        body["messages"] = [{"role": "user", "content": "bench"}]
        body["max_tokens"] = req.get("max_tokens", 8)
        body["stream"] = bool(req.get("stream"))
    if req.get("priority"):
        body["priority"] = req["priority"]
    return body


async def one(client: httpx.AsyncClient, base_url: str, req: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"group": req["group"], "start": time.time()}
    t0 = time.perf_counter()
    first_byte = first_data = None
    try:
        url = base_url + PATHS[req.get("kind", "chat")]
        headers = auth_headers(req.get("api_key"))
        async with client.stream("POST", url, json=_body(req), headers=headers) as response:
            seen = b""
            async for raw in response.aiter_raw():
                now = time.perf_counter() - t0
                first_byte = now if first_byte is None else first_byte
                if first_data is None:
                    seen = seen[-8:] + raw
                    if b"data: " in seen or not req.get("stream"):
                        first_data = now
            record["status"] = response.status_code
            record["id"] = response.headers.get("x-request-id")
    except (httpx.HTTPError, aiohttp.ClientError) as error:
        record["status"] = 0
        record["error"] = repr(error)
    record.update(first_byte=first_byte, first_data=first_data, end=time.perf_counter() - t0)
    return record


async def run_group(client: httpx.AsyncClient, base_url: str, group: dict[str, Any]) -> list:
    results: list[dict[str, Any]] = []
    count = group.get("count", 10**9)
    deadline = time.perf_counter() + group.get("duration_s", 10**9)
    template = {k: v for k, v in group.items() if k not in ("arrivals", "name")}
    template["group"] = group["name"]
    if group.get("start_s"):
        await asyncio.sleep(group["start_s"])
    if "arrivals" in group or "interval_s" in group:
        arrivals = group.get("arrivals") or [
            {"at": i * group["interval_s"]} for i in range(min(count, 10**6))
        ]
        begin = time.perf_counter()
        tasks = []
        for arrival in arrivals:
            delay = begin + arrival["at"] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() > deadline:
                break
            tasks.append(asyncio.create_task(one(client, base_url, {**template, **arrival})))
        return list(await asyncio.gather(*tasks))
    sent = 0

    async def caller() -> None:
        nonlocal sent
        while sent < count and time.perf_counter() < deadline:
            sent += 1
            results.append(await one(client, base_url, template))

    await asyncio.gather(*(caller() for _ in range(group.get("concurrency", 1))))
    return results


async def phase(spec: dict[str, Any]) -> dict[str, Any]:
    """One phase, with a client of its own (no connection a c=32 phase left open weighs on
    the next phase's calls), on the adapters' transport and Switchyard's event loop: the
    load generator shares the host's two cores with what it measures, so the less CPU it
    takes, the more Switchyard and the direct calls get, as with callers on other hosts."""
    client = httpx.AsyncClient(transport=transport(max_connections=0), timeout=600.0)
    async with client:
        for _ in range(spec.get("warmup", 0)):
            await one(client, spec["base_url"], {**spec["groups"][0], "group": "warmup"})
        began = time.perf_counter()
        groups = await asyncio.gather(
            *(run_group(client, spec["base_url"], g) for g in spec["groups"])
        )
        wall = time.perf_counter() - began
    return {"wall_s": wall, "results": [r for g in groups for r in g]}


async def main(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [await phase(spec) for spec in phases]


if __name__ == "__main__":
    results = event_loop.run(main(json.load(sys.stdin)))
    with open(sys.argv[1], "w") as out:
        json.dump(results, out)

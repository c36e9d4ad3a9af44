"""An instant OpenAI-compatible server in its own process, so that what the benchmark
measures is Switchyard and not the upstream: asyncio streams, HTTP/1.1 keep-alive, no
framework, on Switchyard's event loop. `python -m scheduler.benchmarks.upstream --port 0`
prints `listening on PORT`."""

import argparse
import asyncio
import functools
import json
import time

from config import event_loop

WORDS = ["Bench", "reply", "from", "an", "instant", "upstream", "server", "."]


def _json(status: int, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _answer(path: str, body: dict) -> bytes:
    model = body.get("model", "")
    created = int(time.time())
    if path == "/v1/embeddings":
        return _json(
            200,
            {
                "object": "list",
                "model": model,
                "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 0.5, 1.0]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            },
        )
    n = int(body.get("max_tokens") or 8)
    words = [WORDS[i % len(WORDS)] for i in range(n)]
    if not body.get("stream"):
        message = {"role": "assistant", "content": " ".join(words)}
        return _json(
            200,
            {
                "id": "bench",
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
            },
        )
    out = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    ]
    for i, word in enumerate([*words, None]):
        delta = {"content": word + " "} if word else {}
        chunk = {
            "id": "bench",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None if word else "stop"}],
        }
        if i == 0:
            chunk["choices"][0]["delta"]["role"] = "assistant"
        out.append(_chunk(f"data: {json.dumps(chunk)}\n\n".encode()))
    out.append(_chunk(b"data: [DONE]\n\n"))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


async def serve_connection(
    models: list[str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = dict(
                (k.strip().lower(), v.strip()) for k, v in (h.split(":", 1) for h in head[1:] if h)
            )
            raw = await reader.readexactly(int(headers.get("content-length") or 0))
            if method == "GET" and path == "/v1/models":
                data = [{"id": m, "object": "model", "owned_by": "bench"} for m in models]
                writer.write(_json(200, {"object": "list", "data": data}))
            elif method == "POST":
                writer.write(_answer(path, json.loads(raw or b"{}")))
            else:
                writer.write(_json(404, {"error": {"message": f"no route {path}"}}))
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main(port: int, models: list[str]) -> None:
    server = await asyncio.start_server(
        functools.partial(serve_connection, models), "127.0.0.1", port, backlog=1024
    )
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--models", default="bench-instant", help="comma-separated, listed")
    args = parser.parse_args()
    # Switchyard's loop: the less of the host's CPU the upstream takes, the more is left for
    # what is measured (as with a server on a host of its own).
    event_loop.run(main(args.port, args.models.split(",")))

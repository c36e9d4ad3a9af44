"""One HTTP request driven through an ASGI app in the test's own loop, as daphne drives it:
the whole body at once, then `http.disconnect` as soon as the whole answer is sent."""

import asyncio
from dataclasses import dataclass, field


@dataclass
class Answered:
    """What the app sent: its messages, and the answer read from them."""

    sent: list[dict] = field(default_factory=list)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def scope(method: str, path: str, headers: dict[str, str] | None = None, **more) -> dict:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        **more,
    }


async def call(
    app,
    scope: dict,
    body: bytes,
    sent: list[dict] | None = None,
    send_fails: bool = False,
) -> Answered:
    """`app` called with `scope` and `body`; what it sends goes to `sent` (a new list unless
    given). `send_fails`: every send raises, as when the caller is gone."""
    answered = Answered(sent if sent is not None else [])
    done = asyncio.Event()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if incoming:
            return incoming.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if send_fails:
            raise OSError("the caller is gone")
        answered.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    return answered

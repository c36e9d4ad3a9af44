"""One reader per process (and event loop) for every waiting API caller.

Each waiting view used to call `receive` on a channel of its own and cancel it on every
keep-alive timeout. channels-redis shares one blocking read between those receivers, and a
receive cancelled at the wrong moment stalls the others until the read times out (seconds).
Here readers hand each message to the callers of the request it names; a caller only ever
waits on its own local queue.

On Redis, the requests this process creates need no subscription of their own: their ids
end with this inbox's tag, and one pattern subscription (`PSUBSCRIBE`) hears every group
of theirs. Subscribing to and leaving a group per request cost three commands and two
acknowledgements to read (a sixth of the web process's CPU by a profile; 2.4 -> 2.05-2.3 ms
per request in the bench). A request made elsewhere (a job that a caller waits on) joins its
group through the channel layer.

On PostgreSQL the inbox also LISTENs on its tag's channel (`wakeup.origin_channel`): the
transaction that ends a request of ours that is not streamed NOTIFYs it there, so the end
comes with the commit itself, ahead of the channel layer's hint (which the worker sends
once it hears the commit went through). Either may come first; the first is answered.
"""

import asyncio
import functools
import json
import logging
import secrets
import uuid
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from channels_redis.utils import create_pool, decode_hosts
from django.conf import settings
from redis import asyncio as aioredis

from .. import faults, wakeup
from ..channel_hints import request_group

log = logging.getLogger(__name__)
Message = dict[str, Any]
WAKE: Message = {"type": "wake"}  # no hint: re-read the row now
RETRY_S = 1.0  # after its server went away; meanwhile waiters re-read their rows
LISTEN_WAIT_S = 5.0  # for the pattern's subscription, before a first request goes on without


class Inbox:
    def __init__(self, layer: BaseChannelLayer) -> None:
        self.layer = layer
        self.queues: defaultdict[str, set[asyncio.Queue[Message]]] = defaultdict(set)
        self.started = asyncio.Lock()
        self.readers: list[asyncio.Task] = []
        self.channel = ""  # the layer's channel for the groups joined one by one
        self.by_pattern = isinstance(layer, RedisPubSubChannelLayer)
        tagged = self.by_pattern or settings.IS_POSTGRES
        self.tag = secrets.token_hex(wakeup.ORIGIN_HEX // 2) if tagged else ""

    def new_request_id(self) -> uuid.UUID:
        """An id for a request this process creates: random but for its last 8 hex digits,
        so that ids shortened to their start, as pages and people do, still differ."""
        return uuid.UUID(uuid.uuid4().hex[: 32 - len(self.tag)] + self.tag)

    def heard_by_pattern(self, key: str) -> bool:
        return self.by_pattern and key.replace("-", "").endswith(self.tag)

    async def subscribe(self, request_id) -> asyncio.Queue[Message]:
        """A queue of the hints about `request_id`, from now until `unsubscribe`."""
        key = str(request_id)
        async with self.started:
            if not self.readers:
                await self.start()
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self.queues[key].add(queue)
        if not self.heard_by_pattern(key):
            await self.layer.group_add(request_group(request_id), self.channel)
        return queue

    async def unsubscribe(self, request_id, queue: asyncio.Queue[Message]) -> None:
        key = str(request_id)
        self.queues[key].discard(queue)
        if not self.queues[key]:
            del self.queues[key]
            if not self.heard_by_pattern(key):
                await self.layer.group_discard(request_group(request_id), self.channel)

    async def start(self) -> None:
        self.channel = await self.layer.new_channel()
        self.readers.append(self.read_forever(self.read_channel))
        listening: list[asyncio.Event] = []
        if self.by_pattern:
            hosts = decode_hosts(settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"])
            for host in hosts:
                listening.append(ready := asyncio.Event())
                self.readers.append(
                    self.read_forever(functools.partial(self.read_pattern, host, ready))
                )
        if settings.IS_POSTGRES:
            listening.append(ready := asyncio.Event())
            self.readers.append(self.read_forever(functools.partial(self.read_ends, ready)))
        if listening:
            # Heard before the first request of ours is stored: no hint can come earlier.
            # (If Redis or PostgreSQL does not answer, callers re-read their rows meanwhile.)
            waits = [asyncio.create_task(ready.wait()) for ready in listening]
            _, late = await asyncio.wait(waits, timeout=LISTEN_WAIT_S)
            for wait in late:
                wait.cancel()

    def read_forever(self, read: Callable[[], Awaitable[None]]) -> asyncio.Task:
        async def again() -> None:
            while True:
                try:
                    await read()
                except asyncio.CancelledError:
                    raise
                except faults.REDIS_FAULTS as exc:
                    # The server went away: waiters re-read their rows meanwhile, more often
                    # while Redis is down (see waiting.Subscription.messages).
                    faults.REDIS.failed(exc, "reading the API inbox")
                    self.wake_all()
                    await asyncio.sleep(RETRY_S)
                except Exception:
                    log.exception("reading the API inbox failed; reading again")
                    await asyncio.sleep(RETRY_S)

        return asyncio.create_task(again(), name="api inbox")

    async def read_channel(self) -> None:
        while True:
            self.deliver(await self.layer.receive(self.channel))

    async def read_pattern(self, host: dict[str, Any], ready: asyncio.Event) -> None:
        # The name the layer publishes a group under, as its own group_send writes it.
        pattern = self.layer._get_group_channel_name(request_group("")) + "*" + self.tag
        client = aioredis.Redis(connection_pool=create_pool(host))
        try:
            async with client.pubsub() as pubsub:
                await pubsub.psubscribe(pattern)
                async for message in pubsub.listen():
                    if message["type"] == "psubscribe":
                        ready.set()
                        faults.REDIS.works()
                    elif message["type"] == "pmessage":
                        self.deliver(self.layer.deserialize(message["data"]))
        finally:
            await client.aclose()

    async def read_ends(self, ready: asyncio.Event) -> None:
        def heard(payload: str | None) -> None:
            if payload is None:
                ready.set()
            else:
                self.deliver(json.loads(payload))

        await wakeup.listen(wakeup.origin_channel(self.new_request_id()), heard)

    def deliver(self, message: Message) -> None:
        for queue in self.queues.get(message.get("id", ""), ()):
            queue.put_nowait(message)

    def wake_all(self) -> None:
        """Redis failed a reader: every waiter re-reads its row at once, and every 0.5 s
        while it is down, instead of after the silence it was waiting out (a hint may be
        lost)."""
        for queues in self.queues.values():
            for queue in queues:
                queue.put_nowait(WAKE)

    async def close(self) -> None:
        """Stop reading, and let go of the connections read from."""
        for reader in self.readers:
            reader.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        self.readers.clear()


_inboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Inbox]" = (
    weakref.WeakKeyDictionary()
)


def inbox() -> Inbox:
    """This event loop's inbox (tests run several loops in one process)."""
    loop = asyncio.get_running_loop()
    if loop not in _inboxes:
        _inboxes[loop] = Inbox(get_channel_layer())
    return _inboxes[loop]


async def close_inbox() -> None:
    """Close this event loop's inbox, if it has one. A web process's lives as long as the
    process; a loop that ends before (a test's) closes it, or its connections stay open."""
    found = _inboxes.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()

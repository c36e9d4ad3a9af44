"""One channel-layer reader per process (and event loop) for every waiting API caller.

Each waiting view used to call `receive` on a channel of its own and cancel it on every
keep-alive timeout. channels-redis shares one blocking read between those receivers, and a
receive cancelled at the wrong moment stalls the others until the read times out (seconds).
Here one task reads one channel and hands each message to the callers of the request it
names; a caller only ever waits on its own local queue.
"""

import asyncio
import logging
import weakref
from collections import defaultdict
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer

from ..announce import request_group

log = logging.getLogger(__name__)
Message = dict[str, Any]


class Inbox:
    def __init__(self, layer: BaseChannelLayer) -> None:
        self.layer = layer
        self.channel = ""
        self.reader: asyncio.Task | None = None
        self.started = asyncio.Lock()
        self.queues: defaultdict[str, set[asyncio.Queue[Message]]] = defaultdict(set)

    async def subscribe(self, request_id) -> asyncio.Queue[Message]:
        """A queue of the hints about `request_id`, from now until `unsubscribe`."""
        async with self.started:
            if not self.channel:
                self.channel = await self.layer.new_channel()
                self.reader = asyncio.create_task(self.read(), name="api inbox")
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self.queues[str(request_id)].add(queue)
        await self.layer.group_add(request_group(request_id), self.channel)
        return queue

    async def unsubscribe(self, request_id, queue: asyncio.Queue[Message]) -> None:
        key = str(request_id)
        self.queues[key].discard(queue)
        if not self.queues[key]:
            del self.queues[key]
            await self.layer.group_discard(request_group(request_id), self.channel)

    async def read(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # the layer's server went away: waiters re-read the rows
                log.exception("reading the API inbox failed; reading again")
                await asyncio.sleep(1)
                continue
            for queue in self.queues.get(message.get("id", ""), ()):
                queue.put_nowait(message)


_inboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Inbox]" = (
    weakref.WeakKeyDictionary()
)


def inbox() -> Inbox:
    """This event loop's inbox (tests run several loops in one process)."""
    loop = asyncio.get_running_loop()
    if loop not in _inboxes:
        _inboxes[loop] = Inbox(get_channel_layer())
    return _inboxes[loop]

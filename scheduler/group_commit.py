"""Group commit: what tasks submit while one call to the database thread runs goes in the
next call, as one list (one transaction instead of one each)."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    def __init__(
        self, write: Callable[[list[Item]], Awaitable[list[Result]]], running: set
    ) -> None:
        self.write = write  # one call at a time
        self.queued: list[tuple[Item, asyncio.Future[Result]]] = []
        self.flusher: asyncio.Task | None = None
        self.running = running  # the owner's set of chores, awaited when it stops

    async def submit(self, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        # A submitter cancelled meanwhile (a worker that stops) leaves its failed write's
        # error to nobody: it is retrieved here, not logged as never retrieved.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.queued.append((item, future))
        if self.flusher is None:
            # A task of its own: the batch is written even if this submitter is cancelled.
            self.flusher = asyncio.create_task(self.flush(), name="batch write")
            self.running.add(self.flusher)
            self.flusher.add_done_callback(self.running.discard)
        return await asyncio.shield(future)

    async def flush(self) -> None:
        try:
            while self.queued:
                batch, self.queued = self.queued, []
                try:
                    results = await self.write([item for item, _ in batch])
                except Exception as error:
                    for _, future in batch:
                        future.set_exception(error)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    future.set_result(result)
        finally:
            self.flusher = None

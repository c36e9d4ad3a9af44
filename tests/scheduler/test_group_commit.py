"""GroupCommit: what tasks submit while a write runs goes into the next write, together."""

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from scheduler.group_commit import GroupCommit


class GatedWrite:
    """A write that records its batches and holds the first until the test lets it go."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[str]) -> list[str]:
        self.batches.append(items)
        self.started.set()
        self.release.wait(10)
        if "bad" in items:
            raise ValueError("the database said no")
        return [item.upper() for item in items]


async def test_submissions_during_a_write_share_the_next_one():
    write, chores = GatedWrite(), set()
    group = GroupCommit(sync_to_async(write), chores)
    first = asyncio.create_task(group.submit("a"))
    await asyncio.to_thread(write.started.wait, 10)
    rest = [asyncio.create_task(group.submit(item)) for item in ("b", "c")]
    await asyncio.sleep(0)  # let both queue up behind the running write
    write.release.set()

    assert await first == "A"
    assert await asyncio.gather(*rest) == ["B", "C"]
    assert write.batches == [["a"], ["b", "c"]]
    await asyncio.gather(*chores)
    assert not chores


async def test_a_failed_write_fails_its_batch_and_a_cancelled_submitter_still_writes():
    write, chores = GatedWrite(), set()
    group = GroupCommit(sync_to_async(write), chores)
    gone = asyncio.create_task(group.submit("a"))
    await asyncio.to_thread(write.started.wait, 10)
    bad = asyncio.create_task(group.submit("bad"))
    await asyncio.sleep(0)
    gone.cancel()  # its submitter stops waiting; its write goes on
    write.release.set()

    with pytest.raises(ValueError, match="said no"):
        await bad
    await asyncio.gather(*chores)
    assert write.batches == [["a"], ["bad"]]

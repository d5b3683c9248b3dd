"""A tenant's repeated reads are coalesced, and never answered from a stale read."""

from __future__ import annotations

import asyncio

import pytest

from queue_daemon.api.reads import CoalescedReads


class Store:
    def __init__(self) -> None:
        self.value = 0
        self.reads = 0
        self.began: list[float] = []

    async def read(self) -> int:
        self.reads += 1
        self.began.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.02)
        return self.value


async def test_parallel_requests_share_reads_at_most_one_per_interval() -> None:
    store, reads = Store(), CoalescedReads[int](0.1)
    loop = asyncio.get_running_loop()
    stop = loop.time() + 0.5

    async def poll() -> int:
        answers = 0
        while loop.time() < stop:
            await reads.get("a", store.read)
            answers += 1
        return answers

    answers = sum(await asyncio.gather(*(poll() for _ in range(8))))
    assert answers > store.reads
    assert store.reads <= 7  # 0.5 s at one read per 0.1 s, and the first
    gaps = [b - a for a, b in zip(store.began, store.began[1:], strict=False)]
    assert all(gap >= 0.099 for gap in gaps), gaps


async def test_an_answer_comes_from_a_read_begun_after_the_request() -> None:
    store, reads = Store(), CoalescedReads[int](0.1)
    assert await reads.get("a", store.read) == 0
    store.value = 1  # a change, then a request: it must see it
    assert await reads.get("a", store.read) == 1
    other = await reads.get("b", store.read)  # another key is read on its own
    assert other == 1 and store.reads == 3


async def test_a_failed_read_fails_its_waiters_and_the_next_one_reads_again() -> None:
    reads = CoalescedReads[int](0.0)

    async def broken() -> int:
        raise OSError("store down")

    with pytest.raises(OSError):
        await asyncio.gather(*(reads.get("a", broken) for _ in range(3)))
    store = Store()
    assert await reads.get("a", store.read) == 0

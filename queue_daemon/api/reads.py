"""Reads of the store that a tenant may repeat as fast as it likes, coalesced.

``GET /{client}/stats`` and ``GET /{client}/jobs`` ask PostgreSQL for counts
and pages; a tenant polling them in parallel loops would take the store's time
from every other tenant. Here each answer still comes from a read that began
after its request arrived (never a stale one), but one key (a tenant and its
query) starts a read at most every ``interval`` seconds, and never while its
last read is still running: the requests that come meanwhile wait for the
next read and share its answer. A tenant's polling so costs the store at most
one read per interval per query, and at most ``interval`` seconds of latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class CoalescedReads(Generic[T]):
    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._next: dict[Hashable, asyncio.Future[T]] = {}  # not started yet: shared
        self._last: dict[Hashable, tuple[float, asyncio.Future[T]]] = {}  # began, outcome
        self.reads = 0  # reads started
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        shared = self._next.get(key)
        if shared is None:
            shared = self._next[key] = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._start(key, read, shared))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(shared)

    async def _start(
        self, key: Hashable, read: Callable[[], Awaitable[T]], outcome: asyncio.Future[T]
    ) -> None:
        try:
            last = self._last.get(key)
            if last is not None:
                began, previous = last
                with contextlib.suppress(BaseException):
                    await asyncio.shield(previous)  # one read of a key at a time
                rest = began + self.interval - self._clock()
                if rest > 0:
                    await asyncio.sleep(rest)
            del self._next[key]  # requests from now on wait for the read after this one
            self._last[key] = (self._clock(), outcome)
            self.reads += 1
            outcome.set_result(await read())
        except Exception as exc:  # the waiters see it; the next read tries again
            outcome.set_exception(exc)
            outcome.exception()  # retrieved: no warning when no one waits any more
        finally:
            if self._next.get(key) is outcome:
                del self._next[key]
            if not outcome.done():  # cancelled (shutdown)
                outcome.cancel()
        if len(self._last) > 10_000:  # keys of tenants long gone
            self._last = {k: v for k, v in self._last.items() if not v[1].done()}

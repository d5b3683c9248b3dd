"""The daemon's cache of current handler versions.

- A read in flight when its type is invalidated is returned but not kept, so
  an old version read just before a replacement is not served for the next
  ``ttl`` seconds.
- ``at_least`` reads again when the cached version is not the one named.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import cast

from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.runners.models import HandlerSpec
from queue_daemon.store.errors import NotFound
from queue_daemon.store.ports import Store


class Versions:
    """A stand-in store with one handler version per type; reads wait for ``gate``."""

    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads = 0

    async def get_handler(self, type: str) -> HandlerRecord:
        self.reads += 1
        version = self.live.get(type)  # what the read sees: before it waits
        await self.gate.wait()
        if version is None:
            raise NotFound(type)
        return HandlerRecord(
            id=version, type=type, dt=datetime.now(UTC), data={"lang": "python", "body": version}
        )


def version(spec: HandlerSpec | None) -> str | None:
    return None if spec is None else spec.version


async def test_a_read_in_flight_across_an_invalidation_is_not_kept() -> None:
    store = Versions()
    cache = HandlerCache(cast(Store, store))
    store.live["a-t"] = "v1"
    store.gate.clear()
    read = asyncio.create_task(cache.get("a-t"))
    await asyncio.sleep(0)  # the read has seen v1 and waits
    store.live["a-t"] = "v2"
    cache.invalidate("a-t")  # the replacement is announced meanwhile
    store.gate.set()
    assert version(await read) == "v1"  # the caller gets what was read
    assert version(await cache.get("a-t")) == "v2"  # but the next one reads again
    reads = store.reads
    assert version(await cache.get("a-t")) == "v2" and store.reads == reads  # kept now


async def test_at_least_reads_again_unless_the_cached_version_is_the_one_named() -> None:
    store = Versions()
    cache = HandlerCache(cast(Store, store))
    store.live["a-t"] = "v1"
    assert version(await cache.get("a-t")) == "v1"
    store.live["a-t"] = "v2"  # replaced, and this daemon has not heard of it
    reads = store.reads
    assert version(await cache.at_least("a-t", "v1")) == "v1" and store.reads == reads
    assert version(await cache.at_least("a-t", "v2")) == "v2"
    del store.live["a-t"]  # deleted
    assert await cache.at_least("a-t", None) is None
    assert await cache.get("a-t") is None

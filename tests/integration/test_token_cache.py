"""The daemon's token cache against a real store: a token stored a moment ago
is known at once, even right after a reload, and unknown tokens cannot make
the cache reload more than once per ``MISS_RELOAD_S``."""

from __future__ import annotations

import asyncio

import pytest

from queue_daemon.api.auth import TokenCache, hash_token, new_token
from queue_daemon.store.pg import PgStore


class CountingStore:
    """The real store, counting how often the cache reads the tenants' tokens."""

    def __init__(self, store: PgStore) -> None:
        self._store = store
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def tenant_tokens(self) -> dict[bytes, str]:
        self.reads += 1
        return await self._store.tenant_tokens()


async def test_a_token_stored_just_after_a_reload_is_known_at_once(store: PgStore) -> None:
    cache = TokenCache(store)
    await cache.reload()
    key = await store.token_key()
    first = new_token()
    await store.add_tenant("r", hash_token(first, key))
    # the cache reloaded a moment before the tenant was stored: the miss must
    # not be answered from that copy
    await cache.reload()
    second = new_token()
    await store.rotate_tenant("r", hash_token(second, key), 3600)
    assert await cache.client_for(second) == "r"
    assert await cache.client_for(first) == "r"


async def test_unknown_tokens_share_rate_limited_reloads(store: PgStore) -> None:
    counting = CountingStore(store)
    cache = TokenCache(counting)  # type: ignore[arg-type]
    await cache.reload()
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(5):
        results = await asyncio.gather(*(cache.client_for(new_token()) for _ in range(50)))
        assert results == [None] * 50
    elapsed = loop.time() - began
    # 250 misses: one reload per round of concurrent misses, spaced by the limit
    assert counting.reads - 1 <= 5 + elapsed / TokenCache.MISS_RELOAD_S, counting.reads
    assert elapsed >= 4 * TokenCache.MISS_RELOAD_S


@pytest.mark.parametrize("bad", ["", "qd_", "x" * 5000, "qd_\udcff"])
async def test_malformed_tokens_are_unknown(store: PgStore, bad: str) -> None:
    cache = TokenCache(store)
    await cache.reload()
    assert await cache.client_for(bad) is None

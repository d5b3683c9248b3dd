"""The daemon's token cache against a real store: a token stored a moment ago
is known at once, even right after a reload or while one is in flight, and
unknown tokens cannot make the cache reload more than once per ``MISS_RELOAD_S``."""

from __future__ import annotations

import asyncio

import pytest

from queue_daemon.api.tokens import TokenCache, hash_token, new_token
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


class HeldStore:
    """The real store, whose reload can be held open: ``hold`` names the read
    that waits for ``gate`` (and sets ``reached`` when it is there)."""

    def __init__(self, store: PgStore, hold: str) -> None:
        self._store = store
        self._hold = hold
        self.gate = asyncio.Event()
        self.gate.set()
        self.reached = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def _held(self, name: str) -> None:
        if self._hold == name:
            self.reached.set()
            await self.gate.wait()

    async def tenant_tokens(self) -> dict[bytes, str]:
        await self._held("tenant_tokens")
        return await self._store.tenant_tokens()

    async def admin_tokens(self) -> set[bytes]:
        await self._held("admin_tokens")
        return await self._store.admin_tokens()


async def test_a_token_used_while_a_periodic_reload_runs_waits_for_it(
    store: PgStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldStore(store, "tenant_tokens")
    cache = TokenCache(held)  # type: ignore[arg-type]
    await cache.reload()
    token = new_token()
    await store.add_tenant("fresh", hash_token(token, await store.token_key()))  # the CLI
    # uvloop's clock reads the same for a millisecond: the periodic reload begins
    # and the requests come within one reading of it
    loop = asyncio.get_running_loop()
    now = loop.time()
    monkeypatch.setattr(loop, "time", lambda: now)
    held.gate.clear()
    held.reached.clear()
    periodic = asyncio.ensure_future(cache.run(0))
    try:
        await held.reached.wait()  # the periodic reload is in flight, held open
        requests = [asyncio.ensure_future(cache.client_for(token)) for _ in range(16)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert not any(r.done() for r in requests), "a request did not wait for the reload"
        held.gate.set()
        assert await asyncio.gather(*requests) == ["fresh"] * 16
    finally:
        held.gate.set()
        periodic.cancel()
        await asyncio.gather(periodic, return_exceptions=True)
        monkeypatch.undo()
        await cache.reload()  # the reload in flight, if any, has ended


async def test_a_token_stored_after_the_reload_in_flight_read_waits_for_the_next(
    store: PgStore,
) -> None:
    held = HeldStore(store, "admin_tokens")  # held after it read the tenants' tokens
    cache = TokenCache(held)  # type: ignore[arg-type]
    await cache.reload()
    held.gate.clear()
    held.reached.clear()
    reload = asyncio.ensure_future(cache.reload())
    await held.reached.wait()
    token = new_token()
    await store.add_tenant("late", hash_token(token, await store.token_key()))
    request = asyncio.ensure_future(cache.client_for(token))
    await asyncio.sleep(0)
    held.gate.set()
    await reload
    assert await request == "late"  # not answered from the copy read before it came


@pytest.mark.parametrize("bad", ["", "qd_", "x" * 5000, "qd_\udcff"])
async def test_malformed_tokens_are_unknown(store: PgStore, bad: str) -> None:
    cache = TokenCache(store)
    await cache.reload()
    assert await cache.client_for(bad) is None

"""Token rotation in the store (migration 0004) and the keyed token hash."""

from __future__ import annotations

import asyncio
import hashlib
import time

import asyncpg
import pytest

from queue_daemon.api.tokens import hash_token, legacy_hash_token
from queue_daemon.store import queries
from queue_daemon.store.errors import NotFound
from queue_daemon.store.migrate import available_migrations
from queue_daemon.store.pg import PgStore


async def _until_only(store: PgStore, expected: dict[bytes, str], within: float = 10) -> None:
    deadline = time.monotonic() + within
    while True:
        tokens = {h: c for h, c in (await store.tenant_tokens()).items() if c == "r"}
        if tokens == expected:
            return
        assert time.monotonic() < deadline, f"still {tokens}, want {expected}"
        await asyncio.sleep(0.1)


async def test_rotate_keeps_the_old_token_for_the_grace(store: PgStore) -> None:
    await store.add_tenant("r", b"r1")
    await store.rotate_tenant("r", b"r2", 0.5)
    tokens = await store.tenant_tokens()
    assert tokens[b"r1"] == "r" and tokens[b"r2"] == "r"
    listed = {t.client: t for t in await store.list_tenants()}
    assert listed["r"].live_tokens == 2
    assert listed["r"].grace_until is not None
    assert listed["r"].token_hash == b"r2"
    await _until_only(store, {b"r2": "r"})
    listed = {t.client: t for t in await store.list_tenants()}
    assert (listed["r"].live_tokens, listed["r"].grace_until) == (1, None)


async def test_rotating_twice_keeps_at_most_two_live(store: PgStore) -> None:
    await store.add_tenant("r", b"r1")
    await store.rotate_tenant("r", b"r2", 3600)
    await store.rotate_tenant("r", b"r3", 3600)
    tokens = {h: c for h, c in (await store.tenant_tokens()).items() if c == "r"}
    assert tokens == {b"r2": "r", b"r3": "r"}
    await store.rotate_tenant("r", b"r4", 0)  # no grace: the previous one ends at once
    await _until_only(store, {b"r4": "r"})


async def test_revoke_ends_every_token(store: PgStore) -> None:
    await store.add_tenant("r", b"r1")
    await store.add_tenant("other", b"o1")
    await store.rotate_tenant("r", b"r2", 3600)
    await store.revoke_tenant("r")
    assert await store.tenant_tokens() == {b"o1": "other"}
    listed = {t.client: t for t in await store.list_tenants()}
    assert listed["r"].revoked_at is not None and listed["r"].live_tokens == 0
    with pytest.raises(NotFound):
        await store.rotate_tenant("r", b"r3", 10)
    await store.add_tenant("r", b"r5")  # re-activated: only the new token
    assert await store.tenant_tokens() == {b"o1": "other", b"r5": "r"}


async def test_rotate_unknown_is_not_found(store: PgStore) -> None:
    with pytest.raises(NotFound):
        await store.rotate_tenant("nosuch", b"x", 10)
    assert await store.tenant_tokens() == {}


async def test_token_key_is_stable_and_random(store: PgStore, conn: asyncpg.Connection) -> None:
    key = await store.token_key()
    assert len(key) == 32
    assert await store.token_key() == key
    assert await conn.fetchval("SELECT count(*) FROM secrets") == 1


def test_hmac_digest_differs_from_sha256_and_depends_on_the_key() -> None:
    token = "qd_example"
    plain = hashlib.sha256(token.encode()).digest()
    assert legacy_hash_token(token) == plain
    k1, k2 = b"\x01" * 32, b"\x02" * 32
    assert hash_token(token, k1) != plain
    assert hash_token(token, k1) != hash_token(token, k2)
    assert hash_token(token, k1) == hash_token(token, k1)
    assert len(hash_token(token, k1)) == 32


async def test_migration_moves_old_hashes_as_sha256(pg_empty_dsn: str) -> None:
    """A store from before 0004: its tenants' tokens keep working as 'sha256'."""
    c = await asyncpg.connect(pg_empty_dsn)
    try:
        await c.execute(queries.migrations.MIGRATIONS_TABLE)
        for migration in available_migrations():
            if migration.version < 4:
                await c.execute(migration.sql)
                await c.execute(queries.migrations.MIGRATION_RECORD, migration.version)
        old = legacy_hash_token("qd_old")
        await c.execute("INSERT INTO tenants (client, token_hash) VALUES ('old', $1)", old)
        await c.execute(
            "INSERT INTO tenants (client, token_hash, revoked_at) VALUES ('gone', 'g', now())"
        )
        s = await PgStore.connect(pg_empty_dsn, min_size=1, max_size=2)
        try:
            assert await s.tenant_tokens() == {old: "old"}
            schemes = await c.fetch("SELECT client, scheme FROM tenant_tokens ORDER BY client")
            assert [tuple(r) for r in schemes] == [("gone", "sha256"), ("old", "sha256")]
            await s.rotate_tenant("old", hash_token("qd_new", await s.token_key()), 3600)
            assert set((await s.tenant_tokens()).values()) == {"old"}
            assert len(await s.tenant_tokens()) == 2
        finally:
            await s.close()
    finally:
        await c.close()

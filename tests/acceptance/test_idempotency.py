"""An add with an ``Idempotency-Key`` is done once, however often it is sent.

Its ids are derived from the tenant and the key, so the same add sent again,
to any daemon, after a crash, journals the same ids, and ingestion (by id)
keeps the first: a client that lost a reply can retry safely.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from harness.api import Api, assert_error
from harness.daemons import DaemonFactory, add_tenant
from tests.acceptance.storecheck import duplicates, payloads, wait_all_stored


async def add(api: Api, jobtype: str, body: str, key: str) -> list[str]:
    reply = await api.add_raw(jobtype, body, headers={"Idempotency-Key": key})
    assert reply.status == 200, reply
    ids: list[str] = reply.json["ids"]
    return ids


async def test_the_same_key_twice_on_two_daemons_and_after_a_kill_adds_once(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path / "a", cwd=tmp_path)
    first = daemons.start(tmp_path / "a", pg_dsn)
    second = daemons.start(tmp_path / "b", pg_dsn)
    a, b = (Api(session, d.url, "t", token) for d in (first, second))
    ids = await add(a, "pay", "one\ntwo", "order-17")
    assert await add(a, "pay", "one\ntwo", "order-17") == ids  # the same daemon
    assert await add(b, "pay", "one\ntwo", "order-17") == ids  # another daemon
    assert await add(b, "pay", "one\ntwo", "order-18") != ids  # another key
    killed = await add(a, "pay", "three", "order-19")
    first.kill()  # journaled, perhaps not yet in the store
    assert await add(b, "pay", "again", "order-19") == killed
    daemons.start(tmp_path / "a", pg_dsn)  # its journal is ingested on restart
    await wait_all_stored(pg_dsn, [*ids, *killed], 30)
    assert await duplicates(pg_dsn) == []
    stored = await payloads(pg_dsn, [*ids, *killed])
    assert stored == {ids[0]: "one", ids[1]: "two", killed[0]: stored[killed[0]]}
    assert stored[killed[0]] in ("three", "again")  # whichever reached the store first


async def test_keys_are_per_tenant_and_bad_keys_are_400(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    tokens = {c: add_tenant(c, store=pg_dsn, data_dir=tmp_path, cwd=tmp_path) for c in "xy"}
    daemon = daemons.start(tmp_path, pg_dsn)
    x, y = (Api(session, daemon.url, c, tokens[c]) for c in "xy")
    assert await add(x, "t", "p", "k") != await add(y, "t", "p", "k")
    for bad in ("", "k" * 201, "tab\there"):
        reply = await x.add_raw("t", "p", headers={"Idempotency-Key": bad})
        assert_error(reply, 400, "bad_request")

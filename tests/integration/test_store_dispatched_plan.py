"""The insert of a few dispatched jobs runs on one plan per connection (the
function insert_dispatched, migration 0016), so that plan must probe every
table it reads by key whatever their size when it was made."""

from __future__ import annotations

import re

import asyncpg

from queue_daemon.store import queries
from queue_daemon.store.pg import PgStore

ARGS = (
    "text[], text[], timestamptz[], text[], timestamptz[], bool[], text, float8, text, bool, bool"
)


async def _body(conn: asyncpg.Connection) -> tuple[str, dict[str, str]]:
    """The function's query, its parameters as $1..$11, and its SET clauses."""
    row = await conn.fetchrow(
        "SELECT prosrc, proconfig, proargnames FROM pg_proc WHERE proname = 'insert_dispatched'"
    )
    assert row is not None
    query = row["prosrc"].split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    for n, name in sorted(enumerate(row["proargnames"][:11], 1), key=lambda a: -len(a[1])):
        query = re.sub(rf"\b{name}\b", f"${n}", query)
    settings = dict(item.split("=", 1) for item in row["proconfig"])
    return query, settings


async def test_the_dispatched_insert_plan_probes_by_key_on_an_empty_store(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    await store.put_handler("a-t", {"lang": "python", "body": "x"})
    await conn.execute("ANALYZE")  # every table as small as it gets
    query, settings = await _body(conn)
    assert settings == {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}
    for name, value in settings.items():
        await conn.execute(f"SET {name} = {value}")
    await conn.execute(f"PREPARE dispatched({ARGS}) AS {query}")
    rows = await conn.fetch(
        "EXPLAIN EXECUTE dispatched('{a1}', '{a-t}', '{2026-01-01}', '{x}', '{2026-01-01}',"
        " '{t}', 's1', 60, '', true, false)"
    )
    plan = "\n".join(r[0] for r in rows)
    assert "$7" in plan, plan  # the generic plan: the sysid is a parameter
    assert "Seq Scan" not in plan, plan
    for index in ("handlers_live_idx", "paused_pkey", "sysids_pkey"):
        assert index in plan, plan


async def test_a_running_jobs_handler_is_read_by_index(
    store: PgStore, conn: asyncpg.Connection
) -> None:
    """jobs.type is collated "C", handlers.type by the database's default: compared
    as they are, handlers_live_idx could not serve the lookup, and each job read
    every live handler (a renew of pulled jobs, the expiry of lapsed leases, the
    sweep of types no daemon runs)."""
    await conn.execute(
        "INSERT INTO handlers (id, type, data)"
        " SELECT 'h' || i, 'a-t' || i, '{\"lang\": \"worker\"}' FROM generate_series(1, 5000) i"
    )
    await conn.execute("ANALYZE handlers")
    renew = "\n".join(
        r[0]
        for r in await conn.fetch(
            "EXPLAIN " + queries.pulled.RENEW, ["j1"], ["l1"], "a", "w1", 60.0
        )
    )
    expire = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + queries.queue.EXPIRE_LOCKS))
    unhandled = "\n".join(
        r[0] for r in await conn.fetch("EXPLAIN " + queries.queue.UNHANDLED_TYPES, 600.0, "", 100)
    )
    for plan in (renew, expire, unhandled):
        assert "handlers_live_idx" in plan and "Seq Scan on handlers" not in plan, plan

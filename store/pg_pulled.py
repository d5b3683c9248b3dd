"""Pull workers' claims, renewals, completes and hand-backs, and the registry
of workers (``PulledJobs`` in ``store/ports.py``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from queue_daemon.domain.jobs import Release
from queue_daemon.domain.pulled import HeldJob, PulledJob
from queue_daemon.domain.views import DaemonSeen, WorkerSeen
from queue_daemon.store import queries
from queue_daemon.store.errors import StoreError
from queue_daemon.store.pg_base import Db, KeyTurns, row_as, status_count
from queue_daemon.store.pg_graph import GraphPart
from queue_daemon.store.pg_release import write_releases

logger = logging.getLogger(__name__)

# (job id, the whole lock value its claim put on it)
Claim = tuple[str, str]

DEFAULT_LEASE = 60.0  # a pulled job whose type lost its handler is renewed by this much


def _split(claims: Sequence[Claim]) -> tuple[list[str], list[str]]:
    ordered = sorted(claims)  # concurrent updates of the same rows lock them in one order
    return [c[0] for c in ordered], [c[1] for c in ordered]


class PulledPart:
    """Pull workers' claims, renewals, completes and hand-backs (``PulledJobs``),
    and the registry of workers and daemons the dashboard reads."""

    def __init__(self, db: Db, graph: GraphPart) -> None:
        self._db = db
        self._graph = graph  # resolves the dependents of the jobs it ends
        self._keys = KeyTurns()  # where each capped type's next claim starts

    async def claim_pulled(
        self, type: str, limit: int, *, lock: str, lease: float, client: str, worker: str
    ) -> list[PulledJob]:
        rows = await self._db.fetch(
            queries.pulled.CLAIM,
            type,
            limit,
            lock,
            float(lease),
            client,
            worker,
            self._keys.get(type),
        )
        # the row with a NULL id: where the next claim starts (an append of the
        # parts puts it last)
        if rows[-1][0] is None:
            last = rows.pop()
        else:
            last = next(row for row in rows if row[0] is None)
            rows = [row for row in rows if row[0] is not None]
        self._keys.turn(type, last[7])
        # rows read by position (the columns of queries.pulled.CLAIM, in order), as
        # the run loop's claim: a Record's lookup by name costs about as much as
        # the object it fills
        jobs = [
            PulledJob(
                id=id_,
                type=type_,
                data=data,
                attempts=attempts,
                create_dt=create_dt,
                lease_until=lease_until,
                due_ms=due_ms,
                key=key,
                trace=trace,
            )
            for id_, type_, data, attempts, create_dt, lease_until, due_ms, key, trace in rows
        ]
        return jobs  # in the order taken (queries.pulled.CLAIM)

    async def renew_pulled(
        self, claims: Sequence[Claim], *, client: str, worker: str
    ) -> dict[str, datetime]:
        ids, locks = _split(claims)
        rows = await self._db.fetch(queries.pulled.RENEW, ids, locks, client, worker, DEFAULT_LEASE)
        return {row["id"]: row["lease_until"] for row in rows}

    async def existing_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        rows = await self._db.fetch(queries.pulled.EXISTING, list(ids), client)
        return {row["id"] for row in rows}

    async def cancelled_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        rows = await self._db.fetch(queries.pulled.CANCELLED, list(ids), client)
        return {row["id"] for row in rows}

    async def complete_pulled(
        self,
        claims: Sequence[Claim],
        decide: Callable[[list[HeldJob]], Awaitable[list[Release]]],
        *,
        client: str,
        worker: str,
    ) -> set[str]:
        ids, locks = _split(claims)
        lock_of = dict(claims)
        async with self._db.conn() as conn, conn.transaction():
            rows = await conn.fetch(queries.pulled.HELD_FOR_UPDATE, ids, locks, client)
            held = [HeldJob(r["id"], r["type"], r["attempts"], r["create_dt"]) for r in rows]
            releases = await decide(held) if held else []
            applied: set[str] = set()
            if releases:
                # the run loop's statements, each job under its own claim's lock;
                # keeping the first row of an id done already (a unique violation
                # would end this transaction)
                done = await write_releases(conn, releases, lock_of, keep_first=True)
                applied = {row[0] for row in done if row[0] is not None}
                await self._graph.resolve(
                    [row[0] for row in done if row[0] is not None and row[1]], conn
                )
            # last: the worker's row is what its claims update too (their heartbeat)
            codes = [r.code for r in releases if r.id in applied]
            await conn.execute(
                queries.pulled.COUNT_DONE,
                client,
                worker,
                codes.count("ok"),
                codes.count("failed"),
                codes.count("error"),
                codes.count("retry"),
            )
        return applied

    async def archive_pulled(
        self, releases: Sequence[Release], claims: Sequence[Claim], *, client: str, worker: str
    ) -> list[tuple[str, str, int]]:
        if not releases:
            return []
        async with self._db.conn() as conn:
            rows = await write_releases(
                conn, releases, dict(claims), keep_first=True, pulled=(client, worker)
            )
        # a NULL id: the note's row
        done = [(row[0], row[1], row[2]) for row in rows if row[0] is not None]
        try:
            await self._graph.resolve([row[0] for row in rows if row[0] is not None and row[3]])
        except StoreError as exc:
            # the outcomes are stored: the upkeep's sweep resolves what this could not
            logger.warning(
                "dependents of completed jobs not resolved yet: %s",
                exc,
                extra={"action": "resolve_deferred"},
            )
        return done

    async def hand_back(
        self, claims: Sequence[Claim], *, client: str, worker: str
    ) -> dict[str, str]:
        ids, locks = _split(claims)
        rows = await self._db.fetch(queries.pulled.HAND_BACK, ids, locks, client, worker)
        return {row["id"]: row["type"] for row in rows}

    async def done_among(self, ids: Sequence[str]) -> set[str]:
        rows = await self._db.fetch(queries.pulled.DONE_AMONG, list(ids))
        return {row["id"] for row in rows}

    async def workers(self, client: str | None = None) -> list[WorkerSeen]:
        if client is None:
            rows = await self._db.fetch(queries.pulled.ALL_WORKERS)
        else:
            rows = await self._db.fetch(queries.pulled.WORKERS_OF, client)
        return [row_as(WorkerSeen, row) for row in rows]

    async def daemons(self) -> list[DaemonSeen]:
        rows = await self._db.fetch(queries.pulled.DAEMONS)
        return [row_as(DaemonSeen, row) for row in rows]

    async def forget_workers(self) -> int:
        async with self._db.conn() as conn:
            status = await conn.execute(queries.pulled.FORGET_WORKERS)
        return status_count(status)

    async def live_workers(self) -> dict[str, int]:
        rows = await self._db.fetch(queries.pulled.LIVE_WORKERS)
        return {row["client"]: row["n"] for row in rows}

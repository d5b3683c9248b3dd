"""Handlers (``HandlerStore``) and the dashboard's reads (``Dashboard``)."""

from __future__ import annotations

import orjson

from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.domain.views import DaemonLease, FailedJob, QueueDepth, RunningJob, RunningJobs
from queue_daemon.store.errors import LimitReached, NotFound
from tests.fakes.store.queue import Queue, Sysid
from tests.fakes.store.tables import BLOCKED_DT, DONE, DONE_FIELDS, Row, client_of


class Handlers(Queue):
    # --- HandlerStore ---------------------------------------------------------------

    async def put_handler(
        self, type: str, data: dict[str, object], max_handlers: int | None = None
    ) -> HandlerRecord:
        self._call("put_handler")
        if max_handlers is not None and type not in self.handlers:
            client = type.partition("-")[0]
            live = await self.count_handlers(client)
            if live >= max_handlers:
                raise LimitReached(f"{client} has {live} handlers, its limit")
        record = HandlerRecord(
            id=self._handler_id(), type=type, dt=self.now(), data=orjson.loads(orjson.dumps(data))
        )
        self.handlers[type] = record
        return record

    async def get_handler(self, type: str) -> HandlerRecord:
        self._call("get_handler")
        try:
            return self.handlers[type]
        except KeyError:
            raise NotFound(f"no handler for {type!r}") from None

    async def delete_handler(self, type: str) -> None:
        self._call("delete_handler")
        if self.handlers.pop(type, None) is None:
            raise NotFound(f"no handler for {type!r}")

    async def count_handlers(self, client: str) -> int:
        self._call("count_handlers")
        return sum(1 for t in self.handlers if client_of(t) == client)

    # --- Dashboard ------------------------------------------------------------------

    def _scoped(self, client: str | None) -> list[Row]:
        return [r for r in self.rows.values() if client is None or client_of(r.type) == client]

    async def queue_depths(self, client: str | None, limit: int, cap: int) -> list[QueueDepth]:
        self._call("queue_depths")
        now = self.now()
        per_type: dict[str, list[Row]] = {}
        for row in self._scoped(client):
            per_type.setdefault(row.type, []).append(row)
        depths = []
        for type, rows in sorted(per_type.items())[: max(0, limit)]:
            blocked = sum(1 for r in rows if r.lock == "" and r.dt == BLOCKED_DT)
            queued = sum(1 for r in rows if r.lock == "" and r.dt != BLOCKED_DT)
            scheduled = min(cap, sum(1 for r in rows if r.lock == "" and now < r.dt < BLOCKED_DT))
            if scheduled < cap:
                waiting = queued - scheduled
            else:
                waiting = min(cap, sum(1 for r in rows if r.lock == "" and r.dt <= now))
            done = {f: 0 for f in DONE_FIELDS.values()}
            for r in rows:
                if r.lock == DONE and r.code in DONE_FIELDS:
                    done[DONE_FIELDS[r.code]] += 1
            depths.append(
                QueueDepth(
                    type=type,
                    waiting=waiting,
                    scheduled=scheduled,
                    blocked=blocked,
                    capped=waiting >= cap or scheduled >= cap,
                    running=sum(1 for r in rows if r.running),
                    paused=self._paused(type),
                    **done,
                )
            )
        return depths

    async def running_jobs(self, client: str | None, limit: int) -> RunningJobs:
        self._call("running_jobs")
        running = sorted(
            (r for r in self._scoped(client) if r.running), key=lambda r: (r.create_dt, r.id)
        )
        oldest = [
            RunningJob(
                id=r.id,
                type=r.type,
                sysid=f"worker:{r.lock[35:]}" if r.lock.startswith("w:") else r.lock,
                attempts=r.attempts,
                create_dt=r.create_dt,
                lease_until=r.dt,
            )
            for r in running[: max(0, limit)]
        ]
        return RunningJobs(total=len(running) if oldest else 0, oldest=oldest)

    async def recent_failures(
        self, client: str | None, limit: int, result_chars: int, *, type: str | None = None
    ) -> list[FailedJob]:
        self._call("recent_failures")
        failed = sorted(
            (
                r
                for r in self._scoped(client)
                if r.lock == DONE
                and r.code in ("failed", "error")
                and r.done_dt is not None
                and (type is None or r.type == type)
            ),
            key=lambda r: (r.done_dt or r.create_dt, r.id),
            reverse=True,
        )
        return [
            FailedJob(
                id=r.id,
                type=r.type,
                code=r.code or "",
                exitcode=r.exitcode,
                attempts=r.attempts,
                create_dt=r.create_dt,
                done_dt=r.done_dt or r.create_dt,
                result=None if r.result is None else r.result[:result_chars],
                result_cut=r.result is not None and len(r.result) > result_chars,
            )
            for r in failed[: max(0, limit)]
        ]

    async def daemon_leases(self, limit: int) -> list[DaemonLease]:
        self._call("daemon_leases")
        now = self.now()

        def order(item: tuple[str, Sysid]) -> tuple[bool, float, str]:
            sysid, s = item
            live = s.released_at is None and s.expires is not None and s.expires > now
            last = s.released_at or s.expires
            return (not live, -last.timestamp() if last else float("inf"), sysid)

        leases = []
        for sysid, s in sorted(self.sysids.items(), key=order)[: max(0, limit)]:
            state = (
                "released"
                if s.released_at is not None
                else "expired"
                if s.expires is None or s.expires <= now
                else "live"
            )
            leases.append(
                DaemonLease(
                    sysid=sysid,
                    host=s.host,
                    data_dir=s.data_dir,
                    state=state,
                    expires=s.expires,
                    released_at=s.released_at,
                    now=now,
                )
            )
        return leases

    async def archived_counts(self) -> dict[str, int]:
        self._call("archived_counts")
        return dict(self.archived)

"""Pull workers (``PulledJobs``) and their registry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from queue_daemon.domain.jobs import Release, ReleaseHow, epoch_ms
from queue_daemon.domain.pulled import HeldJob, PulledJob
from queue_daemon.domain.views import DaemonSeen, WorkerSeen
from tests.fakes.store.queue import Queue
from tests.fakes.store.tables import DONE, Row, by_of, client_of, later, reason_of

DEFAULT_LEASE = 60.0
DAY = timedelta(days=1)
Claim = tuple[str, str]


@dataclass(slots=True)
class Worker:
    first_seen: datetime
    last_seen: datetime
    lease: float = DEFAULT_LEASE
    done_ok: int = 0
    done_failed: int = 0
    done_error: int = 0
    done_retry: int = 0


class Pulled(Queue):
    def __init__(self) -> None:
        super().__init__()
        self.workers_seen: dict[tuple[str, str], Worker] = {}

    def _heartbeat(self, client: str, worker: str, lease: float | None) -> Worker:
        now = self.now()
        seen = self.workers_seen.get((client, worker))
        if seen is None:
            seen = self.workers_seen[(client, worker)] = Worker(now, now)
            seen.lease = DEFAULT_LEASE if lease is None else lease
        else:
            seen.last_seen = now
            if lease is not None:
                seen.lease = lease
        return seen

    def _held(self, claims: Sequence[Claim], client: str) -> list[Row]:
        rows = [self.rows.get(job_id) for job_id, _ in sorted(set(claims))]
        locks = dict(claims)
        return [
            r
            for r in rows
            if r is not None and r.lock == locks[r.id] and client_of(r.type) == client
        ]

    async def claim_pulled(
        self, type: str, limit: int, *, lock: str, lease: float, client: str, worker: str
    ) -> list[PulledJob]:
        self._call("claim_pulled")
        self._heartbeat(client, worker, lease)
        now = self.now()
        jobs = []
        for row in self._claimable(type, now, limit):
            due_ms = epoch_ms(max(row.dt, row.create_dt))
            row.lock, row.dt, row.run_dt = lock, now + timedelta(seconds=lease), now
            row.attempts += 1
            jobs.append(
                PulledJob(
                    id=row.id,
                    type=row.type,
                    data=row.data,
                    attempts=row.attempts,
                    create_dt=row.create_dt,
                    lease_until=row.dt,
                    due_ms=due_ms,
                    key=row.key,
                    trace=row.trace,
                )
            )
        return jobs  # in the order taken, as the real claim returns them

    async def renew_pulled(
        self, claims: Sequence[Claim], *, client: str, worker: str
    ) -> dict[str, datetime]:
        self._call("renew_pulled")
        self._heartbeat(client, worker, None)
        now = self.now()
        renewed = {}
        for row in self._held(claims, client):
            handler = self._live_handler(row.type)
            timeout = None if handler is None else handler.data.get("timeout")
            lease = DEFAULT_LEASE if timeout is None else float(str(timeout))
            row.dt = renewed[row.id] = now + timedelta(seconds=lease)
        return renewed

    async def existing_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        self._call("existing_jobs")
        return {i for i in ids if i in self.rows and client_of(self.rows[i].type) == client}

    async def cancelled_jobs(self, ids: Sequence[str], *, client: str) -> set[str]:
        self._call("cancelled_jobs")
        mine = await self.existing_jobs(ids, client=client)
        return {i for i in mine if self.rows[i].code == "cancelled"}

    async def complete_pulled(
        self,
        claims: Sequence[Claim],
        decide: Callable[[list[HeldJob]], Awaitable[list[Release]]],
        *,
        client: str,
        worker: str,
    ) -> set[str]:
        self._call("complete_pulled")
        held = self._held(claims, client)
        releases: list[Release] = []
        if held:  # decide may raise: nothing has changed yet
            releases = await decide([HeldJob(r.id, r.type, r.attempts, r.create_dt) for r in held])
        return self._apply(releases, claims, client, worker)

    async def archive_pulled(
        self, releases: Sequence[Release], claims: Sequence[Claim], *, client: str, worker: str
    ) -> list[tuple[str, str, int]]:
        self._call("archive_pulled")
        locks = dict(claims)
        for r in releases:  # (a release without its claim: KeyError, as PostgreSQL's)
            assert r.how is ReleaseHow.ARCHIVE and locks[r.id]
        held = {r.id: (r.type, r.attempts) for r in self._held(claims, client)}
        mine = [r for r in releases if r.id in held and not self._chains(held[r.id][0], r)]
        applied = self._apply(mine, claims, client, worker) if mine else set()
        return [(i, *held[i]) for i in sorted(applied)]

    def _chains(self, type: str, release: Release) -> bool:
        """An ok run of a type whose live handler chains a ``then`` job."""
        handler = self._live_handler(type)
        return release.code == "ok" and handler is not None and bool(handler.data.get("then"))

    def _apply(
        self, releases: Sequence[Release], claims: Sequence[Claim], client: str, worker: str
    ) -> set[str]:
        """queries.release's statements: each release where its claim holds its job."""
        releases = sorted(releases, key=lambda r: r.id)
        now, locks = self.now(), dict(claims)
        applied: set[str] = set()
        for r in releases:
            row = self.rows.get(r.id)
            if row is None or row.lock != locks.get(r.id) or r.id in applied:
                continue
            applied.add(r.id)
            row.ran(
                {
                    "started": None if row.run_dt is None else epoch_ms(row.run_dt),
                    "ended": epoch_ms(now),
                    "by": by_of(row.lock),
                    "exitcode": r.exitcode,
                    "code": r.code,
                    "reason": reason_of(r.code),
                }
            )
            if r.code is not None:
                row.log = r.log  # the last run's, as queries.release writes it
            if r.how is ReleaseHow.ARCHIVE:
                self._archive(row, now, r.code, r.exitcode, r.result)
                continue
            # queries.release.RELEASE: only a retry is due again (after its delay)
            row.lock, row.code, row.exitcode, row.result = "", r.code, r.exitcode, r.result
            row.dt = now + timedelta(seconds=r.delay) if r.how is ReleaseHow.RETRY else later(now)
        self.resolve([i for i in sorted(applied) if self.rows[i].lock == DONE])
        seen = self._heartbeat(client, worker, None)
        codes = [r.code for r in releases if r.id in applied]
        seen.done_ok += codes.count("ok")
        seen.done_failed += codes.count("failed")
        seen.done_error += codes.count("error")
        seen.done_retry += codes.count("retry")
        return applied

    async def hand_back(
        self, claims: Sequence[Claim], *, client: str, worker: str
    ) -> dict[str, str]:
        self._call("hand_back")
        self._heartbeat(client, worker, None)
        now = self.now()
        back = {}
        for row in self._held(claims, client):
            row.lock, row.dt, row.attempts = "", now, max(row.attempts - 1, 0)
            back[row.id] = row.type
        return back

    async def done_among(self, ids: Sequence[str]) -> set[str]:
        self._call("done_among")
        return {i for i in ids if i in self.rows and self.rows[i].lock == DONE}

    async def daemons(self) -> list[DaemonSeen]:
        self._call("daemons")
        now = self.now()
        running: dict[str, int] = {}
        for row in self.rows.values():
            if row.running and not row.lock.startswith("w:"):
                running[row.lock] = running.get(row.lock, 0) + 1
        seen = []
        for sysid, s in sorted(self.sysids.items()):
            if s.holder is None or (s.released_at or s.expires or now) <= now - DAY:
                continue
            state = (
                "released"
                if s.released_at is not None
                else "expired"
                if s.expires is None or s.expires < now
                else "live"
            )
            seen.append(
                DaemonSeen(
                    sysid=sysid,
                    host=s.host,
                    state=state,
                    expires=s.expires,
                    released_at=s.released_at,
                    running=running.get(sysid, 0),
                )
            )
        return seen

    async def forget_workers(self) -> int:
        self._call("forget_workers")
        cutoff = self.now() - DAY
        old = [k for k, w in self.workers_seen.items() if w.last_seen < cutoff]
        for key in old:
            del self.workers_seen[key]
        return len(old)

    async def workers(self, client: str | None = None) -> list[WorkerSeen]:
        self._call("workers")
        now = self.now()
        holding: dict[tuple[str, str], int] = {}
        for row in self.rows.values():
            if row.running and row.lock.startswith("w:"):
                key = (client_of(row.type), row.lock[35:])
                holding[key] = holding.get(key, 0) + 1
        return [
            WorkerSeen(
                client=c,
                name=name,
                first_seen=w.first_seen,
                last_seen=w.last_seen,
                live=w.last_seen + timedelta(seconds=w.lease) > now,
                holding=holding.get((c, name), 0),
                done_ok=w.done_ok,
                done_failed=w.done_failed,
                done_error=w.done_error,
                done_retry=w.done_retry,
            )
            for (c, name), w in sorted(self.workers_seen.items())
            if (client is None or c == client) and w.last_seen > now - DAY
        ]

    async def live_workers(self) -> dict[str, int]:
        self._call("live_workers")
        now = self.now()
        live: dict[str, int] = {}
        for (c, _), w in sorted(self.workers_seen.items()):
            if w.last_seen > now - DAY and w.last_seen + timedelta(seconds=w.lease) > now:
                live[c] = live.get(c, 0) + 1
        return live

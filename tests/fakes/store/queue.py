"""The claim path (``JobQueue``) and the daemons' sysid leases (``SysidLeases``)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from queue_daemon.domain.jobs import (
    ClaimedJob,
    Dispatch,
    ExpiredLock,
    NewJob,
    Progress,
    Release,
    ReleaseHow,
    UnhandledRound,
    epoch_ms,
)
from queue_daemon.domain.names import iso
from queue_daemon.store.errors import SysidTaken
from queue_daemon.store.listen import Delays
from tests.fakes.store.tables import (
    DEFAULT_MAX_ATTEMPTS,
    DONE,
    LEASE_EXPIRED_EXIT,
    Row,
    Tables,
    by_of,
    reason_of,
)


@dataclass(slots=True)
class Sysid:
    holder: str | None
    host: str | None
    data_dir: str | None
    expires: datetime | None
    released_at: datetime | None = None


def _secs(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


class Queue(Tables):
    def __init__(self) -> None:
        super().__init__()
        self.sysids: dict[str, Sysid] = {}
        self._sysid_seq = itertools.count(1)

    # --- SysidLeases ----------------------------------------------------------------

    async def reserve_sysid(
        self,
        sysid: str | None,
        *,
        holder: str,
        host: str,
        data_dir: str,
        lease: float,
        takeover: bool = False,
    ) -> str:
        self._call("reserve_sysid")
        now = self.now()
        if sysid is None:
            sysid = next(s for s in map(str, self._sysid_seq) if s not in self.sysids)
        old = self.sysids.get(sysid)
        if old is not None and not (
            old.released_at is not None
            or old.expires is None
            or old.expires <= now
            or old.holder == holder
            or (takeover and old.host == host and old.data_dir == data_dir)
        ):
            raise SysidTaken(f"sysid {sysid!r} is leased by another daemon")
        self.sysids[sysid] = Sysid(holder, host, data_dir, now + _secs(lease))
        return sysid

    async def renew_sysid(self, sysid: str, *, holder: str, lease: float) -> None:
        self._call("renew_sysid")
        row = self.sysids.get(sysid)
        if row is None or row.holder != holder or row.released_at is not None:
            raise SysidTaken(f"sysid {sysid!r} is no longer ours")
        row.expires = self.now() + _secs(lease)

    async def release_sysid(self, sysid: str, *, holder: str) -> None:
        self._call("release_sysid")
        row = self.sysids.get(sysid)
        if row is not None and row.holder == holder and row.released_at is None:
            row.released_at = row.expires = self.now()

    def _lapsed(self, sysid: str, now: datetime) -> bool:
        row = self.sysids.get(sysid)
        return row is not None and (
            row.released_at is not None or (row.expires is not None and row.expires < now)
        )

    # --- JobQueue -------------------------------------------------------------------

    async def waiting_jobtypes(self, limit_per_type: int = 1000) -> dict[str, int]:
        self._call("waiting_jobtypes")
        now, cap = self.now(), max(1, limit_per_type)
        counts: dict[str, int] = {}
        for row in self.rows.values():
            if self._due(row, now) and self._run_here(row.type) and not self._paused(row.type):
                counts[row.type] = min(counts.get(row.type, 0) + 1, cap)
        return counts

    async def claim(self, type: str, limit: int, *, sysid: str, lease: float) -> list[ClaimedJob]:
        self._call("claim")
        now = self.now()
        if limit < 1 or self._lapsed(sysid, now):
            return []
        handler = self._live_handler(type)
        claimed = []
        for row in self._claimable(type, now, limit):
            due_ms = epoch_ms(max(row.dt, row.create_dt))
            row.lock, row.dt, row.run_dt = sysid, now + _secs(lease), now
            row.attempts += 1
            claimed.append(
                ClaimedJob(
                    id=row.id,
                    type=row.type,
                    data=row.data,
                    attempts=row.attempts,
                    created_ms=epoch_ms(row.create_dt),
                    due_ms=due_ms,
                    handler=None if handler is None else handler.id,
                    deadline=row.deadline,
                    key=row.key,
                    trace=row.trace,
                )
            )
        return claimed  # in the order taken, as the real claim returns them

    async def add_dispatched(
        self,
        jobs: Sequence[NewJob],
        dispatch: Dispatch,
        *,
        fresh: bool = True,
        early: bool = False,
    ) -> tuple[int, list[ClaimedJob]]:
        self._call("add_dispatched")
        now = self.now()
        lapsed = self._lapsed(dispatch.sysid, now)
        added, claimed = 0, []
        if early and lapsed:
            return 0, []
        for job in jobs:
            found = self.rows.get(job.id)
            assert not (fresh and found is not None and found.lock == DONE), (
                f"a fresh batch holds {job.id!r}, a job already done"
            )
            if found is not None:
                continue
            row = self.rows[job.id] = Row(job.id, job.type, job.dt, job.data, job.create_dt)
            self._unflushed.append(job.id)
            added += 1
            if (
                job.id in dispatch.ids
                and not lapsed
                and (dispatch.running or not self._paused(job.type))
            ):
                handler = self._live_handler(job.type)
                row.lock, row.dt, row.run_dt = dispatch.sysid, now + _secs(dispatch.lease), now
                row.attempts = 1
                claimed.append(
                    ClaimedJob(
                        id=row.id,
                        type=row.type,
                        data=row.data,
                        attempts=1,
                        created_ms=epoch_ms(row.create_dt),
                        due_ms=epoch_ms(max(job.dt, job.create_dt)),
                        handler=None if handler is None else handler.id,
                    )
                )
        return added, claimed

    async def unhandled_types(
        self, older_than: float, *, after: str = "", steps: int = 5_000
    ) -> UnhandledRound | None:
        self._call("unhandled_types")
        cutoff = self.now() - _secs(older_than)
        oldest: dict[str, datetime] = {}
        for row in self.rows.values():
            if row.lock == "" and row.type > after:
                oldest[row.type] = min(row.dt, oldest.get(row.type, row.dt))
        types = sorted(oldest)[: max(1, steps)]
        expired = []
        for type in types:
            handler = self._live_handler(type)
            lang = None if handler is None else handler.data.get("lang")
            if oldest[type] < cutoff and lang in (None, "worker") and not self._paused(type):
                expired.append((type, lang == "worker"))
        return UnhandledRound(
            expired=expired, next_after=types[-1] if len(types) >= steps else None
        )

    async def expire_waiting(self, type: str, older_than: float, result: str) -> list[str]:
        self._call("expire_waiting")
        if self._paused(type):
            return []
        now = self.now()
        cutoff = now - _secs(older_than)
        rows = sorted(
            (
                r
                for r in self.rows.values()
                if r.type == type and r.lock == "" and r.dt < cutoff and r.create_dt < cutoff
            ),
            key=lambda r: r.dt,
        )
        for row in rows:
            self._archive(row, now, "error", 503, result)
        self.resolve([r.id for r in rows if r.dependents])
        return [r.id for r in rows]

    async def note_progress(self, notes: Sequence[Progress]) -> set[str]:
        self._call("note_progress")
        at = iso(self.now())
        written = set()
        for note in notes:
            row = self.rows.get(note.id)
            if row is not None and row.lock == note.lock:
                row.progress = {"fraction": note.fraction, "message": note.message, "at": at}
                written.add(note.id)
        return written

    async def renew(self, ids: Sequence[str], *, sysid: str, lease: float) -> int:
        self._call("renew")
        now = self.now()
        mine = [self.rows[i] for i in set(ids) if i in self.rows and self.rows[i].lock == sysid]
        for row in mine:
            row.dt = now + _secs(lease)
        return len(mine)

    async def release(self, releases: Sequence[Release], *, sysid: str) -> set[str]:
        self._call("release")
        now = self.now()
        applied: set[str] = set()
        for r in sorted(releases, key=lambda r: r.id):
            row = self.rows.get(r.id)
            if row is None or row.lock != sysid or r.id in applied:
                continue
            applied.add(r.id)
            if r.code is not None and not r.refund_attempt:
                row.ran(
                    {
                        "started": None if row.run_dt is None else epoch_ms(row.run_dt),
                        "ended": epoch_ms(now),
                        "by": f"sysid:{sysid}",
                        "exitcode": r.exitcode,
                        "code": r.code,
                        "reason": reason_of(r.code),
                    }
                )
            if r.refund_attempt:
                row.attempts = max(row.attempts - 1, 0)
            if r.code is not None:
                row.log = r.log  # the last run's, as queries.release writes it
            code, exitcode, result = (
                (row.code, row.exitcode, row.result)
                if r.code is None
                else (r.code, r.exitcode, r.result)
            )
            if r.how is ReleaseHow.ARCHIVE:
                self._archive(row, now, code, exitcode, result)
            else:
                row.lock = ""
                row.dt = now + _secs(r.delay if r.how is ReleaseHow.RETRY else 0.0)
                row.code, row.exitcode, row.result = code, exitcode, result
        self.resolve([i for i in sorted(applied) if self.rows[i].lock == DONE])
        return applied

    async def expire_locks(self) -> list[ExpiredLock]:
        self._call("expire_locks")
        now = self.now()
        lapsed = [
            r for r in self.rows.values() if r.running and (r.dt < now or self._lapsed(r.lock, now))
        ]
        expired = []
        for row in lapsed:
            handler = self._live_handler(row.type)
            most = DEFAULT_MAX_ATTEMPTS
            if handler is not None and handler.data.get("maxAttempts") is not None:
                most = int(str(handler.data["maxAttempts"]))
            last = row.attempts >= most
            row.ran(
                {
                    "started": None if row.run_dt is None else epoch_ms(row.run_dt),
                    "ended": epoch_ms(now),
                    "by": by_of(row.lock),
                    "exitcode": None,
                    "code": None,
                    "reason": "lease-expired",
                }
            )
            if last:
                result = (
                    f"the lease of each of its {row.attempts} runs ran out"
                    " (what ran it died or stalled)"
                )
                self._archive(row, now, "error", LEASE_EXPIRED_EXIT, result)
            else:
                row.lock, row.dt = "", now
            expired.append(ExpiredLock(row.id, row.type, row.attempts, last))
        self.resolve([e.id for e in expired if e.ended])
        return expired

    async def purge(self, older_than: float) -> dict[str, int]:
        self._call("purge")
        cutoff = self.now() - _secs(older_than)
        purged: dict[str, int] = {}
        for row in list(self.rows.values()):
            if row.lock == DONE and row.done_dt is not None and row.done_dt < cutoff:
                del self.rows[row.id]
                purged[row.type] = purged.get(row.type, 0) + 1
        return purged

    async def fold_counts(self) -> bool:
        self._call("fold_counts")
        return True  # the counts are read from the rows: nothing to fold

    async def notify_jobs(self) -> None:
        self._call("notify_jobs")

    async def listen(
        self,
        on_jobs: Callable[[dict[str, int] | None], None],
        on_handler: Callable[[str], None],
        *,
        retry: Delays,
        on_done: Callable[[set[str] | None], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> None:
        if on_cancel is not None:
            self.cancel_listeners.append(on_cancel)
        on_jobs(None)
        await asyncio.Event().wait()  # until cancelled

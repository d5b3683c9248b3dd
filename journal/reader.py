"""The journal's reading side: readers reserve whole batches (returned ones first,
then fresh ones), read them (from memory when still cached, else from the
segment file) and rsync them, which advances and persists the read point; a
reservation not rsync'ed in time is handed out again. ``Journal`` is this and
the writing side (``queue_daemon.journal.journal``)."""

import asyncio
import heapq
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from queue_daemon.journal.errors import JournalError
from queue_daemon.journal.format import parse_body, segment_name
from queue_daemon.journal.models import BatchRecord, Entry, JournalLag, Reservation
from queue_daemon.journal.readpoint import ReadPoint, ReadPointFile
from queue_daemon.journal.segments import (
    delete_segments,
    read_bodies,
)

logger = logging.getLogger(__name__)


class JournalReader:
    """The reading half of ``Journal``; its state is made by ``Journal.__init__``."""

    path: Path
    _loop: asyncio.AbstractEventLoop
    _io: ThreadPoolExecutor
    _closed: bool
    _rp_file: ReadPointFile
    _segments: list[int]
    _seq: int
    _unsynced: deque[BatchRecord]
    _fresh: deque[BatchRecord]
    _returned: list[tuple[int, BatchRecord]]
    _reservations: dict[int, Reservation]
    _next_rid: int
    _readable: asyncio.Event
    _unread_lines: int
    _unread_bytes: int
    _durable_end: tuple[int, int]
    _read_point: ReadPoint
    _persisted: ReadPoint
    _rp_lock: asyncio.Lock
    _cache_used: int

    # ---- reading -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError(f"journal {self.path} is closed")

    def _expire(self, now: float) -> None:
        for rid, r in list(self._reservations.items()):
            if r.expires_at <= now:
                del self._reservations[rid]
                for b in r.batches:
                    if b.reserved_by == rid and not b.synced:
                        b.reserved_by = 0
                        b.seen = True
                        b.tag = None  # read again as any line that may be stored
                        heapq.heappush(self._returned, (b.seq, b))

    def _peek_returned(self) -> BatchRecord | None:
        heap = self._returned
        while heap:
            b = heap[0][1]
            if not b.synced and not b.reserved_by:
                return b
            heapq.heappop(heap)
        return None

    @property
    def unreserved(self) -> bool:
        """Whether durable batches wait for a reader (none has reserved them)."""
        return bool(self._fresh) or self._peek_returned() is not None

    def read_reserve(
        self, max_lines: int, timeout: float, max_bytes: int | None = None
    ) -> Reservation | None:
        """Reserve the next readable whole batches, up to max_lines and max_bytes of
        bodies (at least one batch, however large).

        Batches of a reservation not rsync'ed within ``timeout`` seconds become
        readable again, ahead of newer ones. None when nothing is readable.
        """
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self._check_open()
        now = time.monotonic()
        self._expire(now)
        taken: list[BatchRecord] = []
        lines = size = 0
        byte_cap = max_bytes if max_bytes is not None else float("inf")
        full = False
        while (b := self._peek_returned()) is not None:
            if taken and (lines + b.lines > max_lines or size + b.body_len > byte_cap):
                full = True
                break
            heapq.heappop(self._returned)
            taken.append(b)
            lines += b.lines
            size += b.body_len
        fresh = self._fresh
        while not full and fresh:
            b = fresh[0]
            if taken and (lines + b.lines > max_lines or size + b.body_len > byte_cap):
                break
            fresh.popleft()
            taken.append(b)
            lines += b.lines
            size += b.body_len
        if not taken:
            return None
        rid = self._next_rid
        self._next_rid += 1
        for b in taken:
            b.reserved_by = rid
        r = Reservation(id=rid, lines=lines, expires_at=now + timeout, batches=tuple(taken))
        self._reservations[rid] = r
        return r

    async def read(self, r: Reservation) -> list[Entry]:
        """The entries of a reservation, in journal order."""
        self._check_open()
        missing = [b for b in r.batches if b.body is None]
        loaded: dict[int, str] = {}
        if missing:
            wanted = [(b.segment, b.body_offset, b.body_len, b.crc) for b in missing]
            try:
                bodies = await self._loop.run_in_executor(self._io, read_bodies, self.path, wanted)
            except OSError as e:
                raise JournalError(f"cannot read journal {self.path}: {e}") from e
            loaded = {id(b): body for b, body in zip(missing, bodies, strict=True)}
        out: list[Entry] = []
        for b in r.batches:
            body = b.body if b.body is not None else loaded[id(b)]
            try:
                out.extend(parse_body(body))
            except ValueError:
                # The checksum matched, so a writer produced this: never hand out part of it.
                logger.error(
                    "journal: malformed line in batch seq=%d at %s:%d, skipped",
                    b.seq,
                    segment_name(b.segment),
                    b.offset,
                    extra={
                        "action": "journal_corrupt",
                        "segment": segment_name(b.segment),
                        "offset": b.offset,
                        "reason": "malformed line",
                    },
                )
        return out

    async def rsync(self, r: Reservation) -> None:
        """Mark the reservation ingested; return once the read point is durable.

        An expired reservation may still be rsync'ed (its batches were ingested).
        """
        self._check_open()
        self._reservations.pop(r.id, None)
        for b in r.batches:
            if not b.synced:
                b.synced = True
                b.reserved_by = 0
                self._unread_lines -= b.lines
                self._unread_bytes -= b.size
                b.tag = None
                if b.body is not None:
                    self._cache_used -= b.body_len
                    b.body = None
        self._advance()
        await self._persist_read_point()

    def _advance(self) -> None:
        unsynced = self._unsynced
        while unsynced and unsynced[0].synced:
            unsynced.popleft()
        pos = (unsynced[0].segment, unsynced[0].offset) if unsynced else self._durable_end
        if pos > self._read_point.position:
            self._read_point = ReadPoint(pos[0], pos[1], self._seq)

    async def _persist_read_point(self) -> None:
        async with self._rp_lock:
            rp = self._read_point
            if rp.position == self._persisted.position:
                return
            try:
                await self._loop.run_in_executor(self._io, self._rp_file.append, rp)
            except OSError as e:
                raise JournalError(f"cannot persist the read point of {self.path}: {e}") from e
            self._persisted = rp
            done = [s for s in self._segments if s < rp.segment]
            if done:
                self._segments = [s for s in self._segments if s >= rp.segment]
                try:
                    await self._loop.run_in_executor(self._io, delete_segments, self.path, done)
                except OSError as e:  # harmless: the next open deletes them
                    logger.warning(
                        "journal: cannot delete ingested segments: %s",
                        e,
                        extra={"action": "journal_delete_failed", "path": str(self.path)},
                    )

    # The timeout is part of the journal's API (the ingester's idle wait).
    async def wait_readable(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until something can be reserved (new batch or expired reservation)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            now = time.monotonic()
            self._expire(now)
            if self.unreserved:
                return True
            wait = None if deadline is None else deadline - now
            if wait is not None and wait <= 0:
                return False
            if self._reservations:
                next_expiry = min(r.expires_at for r in self._reservations.values()) - now
                wait = next_expiry if wait is None else min(wait, next_expiry)
            self._readable.clear()
            try:
                async with asyncio.timeout(max(wait, 0.0) if wait is not None else None):
                    await self._readable.wait()
            except TimeoutError:
                pass
        return False

    @property
    def lag(self) -> JournalLag:
        first = self._unsynced[0] if self._unsynced else None
        return JournalLag(
            unread_lines=self._unread_lines,
            unread_bytes=self._unread_bytes,
            oldest_unread_ms=first.create_ms if first is not None else None,
        )

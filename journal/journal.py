"""The journal: durable appends with group commit, and at-least-once reading.

Writers append their framed batch to a pending list and await a future; one
flusher task hands everything pending to a single write thread, which writes it
and fdatasyncs once, then resolves all those futures. Only then do the batches
become visible to readers, who reserve whole batches, read them (from memory
when still cached, else from the segment file) and rsync them, which advances
and persists the read point.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from journal.errors import JournalError, JournalUnavailable
from journal.format import EncodedBatch, encode_batch, parse_body, segment_name
from journal.models import BatchRecord, Entry, JournalLag, Reservation
from journal.readpoint import ReadPoint, ReadPointFile
from journal.recovery import Recovered, recover
from journal.segments import (
    FatalWriteError,
    SegmentWriter,
    delete_segments,
    read_bodies,
    release_lock,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _PendingWrite:
    batch: EncodedBatch
    create_ms: int
    future: asyncio.Future[None]


class Journal:
    """A durable local append-only journal in one directory (see docs/architecture.md)."""

    def __init__(
        self,
        path: Path,
        recovered: Recovered,
        *,
        io_executor: ThreadPoolExecutor,
        segment_bytes: int,
        cache_bytes: int,
    ) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self._loop = asyncio.get_running_loop()
        self._io = io_executor  # recovery, reads, read point, deletions
        self._write_exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-write")
        self._writer: SegmentWriter = recovered.writer
        self._rp_file: ReadPointFile = recovered.read_point_file
        self._lock_fd = recovered.lock_fd
        self._segments: list[int] = recovered.segments

        self._seq = recovered.max_seq
        self._pending: list[_PendingWrite] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._broken: str | None = None
        self._flusher = asyncio.create_task(self._flush_loop(), name=f"journal-flusher {path}")
        self._flusher.add_done_callback(self._flusher_done)

        self._unsynced: deque[BatchRecord] = deque(recovered.batches)
        self._fresh: deque[BatchRecord] = deque(recovered.batches)  # never reserved
        self._returned: list[tuple[int, BatchRecord]] = []  # expired, heap by seq
        self._reservations: dict[int, Reservation] = {}
        self._next_rid = 1
        self._readable = asyncio.Event()
        self._unread_lines = sum(b.lines for b in recovered.batches)
        self._unread_bytes = sum(b.size for b in recovered.batches)
        self._durable_end = recovered.durable_end
        self._read_point = recovered.read_point
        self._persisted = recovered.read_point
        self._rp_lock = asyncio.Lock()
        self._cache_bytes = cache_bytes
        self._cache_used = 0

    @classmethod
    async def open(
        cls, path: Path, *, segment_bytes: int = 64 << 20, cache_bytes: int = 64 << 20
    ) -> Journal:
        """Create the directory if missing, lock it (JournalError if held), recover.

        ``cache_bytes`` bounds the bodies of written batches kept in memory for readers.
        """
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        loop = asyncio.get_running_loop()
        io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-io")
        try:
            recovered = await loop.run_in_executor(io, recover, path, segment_bytes)
        except OSError as e:
            io.shutdown(wait=False)
            raise JournalError(f"cannot open journal {path}: {e}") from e
        except BaseException:
            io.shutdown(wait=False)
            raise
        return cls(
            path, recovered, io_executor=io, segment_bytes=segment_bytes, cache_bytes=cache_bytes
        )

    # ---- writing -------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False once closed or after a failed fsync (writes raise JournalUnavailable)."""
        return not self._closed and self._broken is None

    @property
    def fsync_count(self) -> int:
        """fdatasync calls made for appends (group commit makes this < number of writes)."""
        return self._writer.fsync_count

    async def write(
        self,
        type: str,
        ids: Sequence[str],
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
    ) -> None:
        """Append one batch; return once it is durable (fdatasync'ed).

        ValueError on bad input, JournalUnavailable if it cannot be written. If the
        caller is cancelled the batch may still be written.
        """
        if self._closed:
            raise JournalUnavailable(f"journal {self.path} is closed")
        if self._broken is not None:
            raise JournalUnavailable(self._broken)
        batch = encode_batch(self._seq + 1, type, ids, payloads, create_ms=create_ms, dt_ms=dt_ms)
        self._seq += 1
        future: asyncio.Future[None] = self._loop.create_future()
        self._pending.append(_PendingWrite(batch, create_ms, future))
        self._wake.set()
        await future

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                items, self._pending = self._pending, []
                await self._flush(items)
            if self._closed:
                return

    def _flusher_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._broken = f"journal flusher died: {task.exception()!r}"
            logger.error(
                "journal: flusher died",
                exc_info=task.exception(),
                extra={"action": "journal_flusher_died", "path": str(self.path)},
            )
            for item in self._pending:
                if not item.future.done():
                    item.future.set_exception(JournalUnavailable(self._broken))
            self._pending = []

    async def _flush(self, items: list[_PendingWrite]) -> None:
        if self._broken is not None:
            self._fail(items, JournalUnavailable(self._broken))
            return
        records = [item.batch.record for item in items]
        try:
            segment, offset, _ = await self._loop.run_in_executor(
                self._write_exec, self._writer.append, records
            )
        except FatalWriteError as e:
            self._broken = str(e)
            logger.error(
                "journal: %s; refusing further writes",
                e,
                extra={"action": "journal_broken", "path": str(self.path)},
            )
            self._fail(items, e)
            return
        except JournalUnavailable as e:
            logger.error("journal: %s", e, extra={"action": "journal_write_failed"})
            self._fail(items, e)
            return
        except Exception as e:  # unknown state of the file: same as a failed fsync
            self._broken = f"journal write failed: {e!r}"
            logger.exception("journal: write failed", extra={"action": "journal_broken"})
            self._fail(items, JournalUnavailable(self._broken))
            return
        finally:
            # A rotation may have happened even if the write then failed.
            if self._writer.segment > self._segments[-1]:
                self._segments.append(self._writer.segment)
        for item in items:
            b = item.batch
            size = len(b.record)
            rec = BatchRecord(
                seq=b.seq,
                segment=segment,
                offset=offset,
                end=offset + size,
                body_offset=offset + b.header_len,
                body_len=b.body_len,
                crc=b.crc,
                lines=b.lines,
                create_ms=item.create_ms,
            )
            if self._cache_used + b.body_len <= self._cache_bytes:
                rec.body = b.body
                self._cache_used += b.body_len
            offset += size
            self._unsynced.append(rec)
            self._fresh.append(rec)
            self._unread_lines += b.lines
            self._unread_bytes += size
        self._durable_end = (segment, offset)
        self._readable.set()
        for item in items:
            if not item.future.done():
                item.future.set_result(None)

    @staticmethod
    def _fail(items: list[_PendingWrite], error: BaseException) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)

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
                        heapq.heappush(self._returned, (b.seq, b))

    def _peek_returned(self) -> BatchRecord | None:
        heap = self._returned
        while heap:
            b = heap[0][1]
            if not b.synced and not b.reserved_by:
                return b
            heapq.heappop(heap)
        return None

    def _has_readable(self) -> bool:
        return bool(self._fresh) or self._peek_returned() is not None

    def read_reserve(self, max_lines: int, timeout: float) -> Reservation | None:
        """Reserve the next readable whole batches, up to max_lines (at least one batch).

        Batches of a reservation not rsync'ed within ``timeout`` seconds become
        readable again, ahead of newer ones. None when nothing is readable.
        """
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self._check_open()
        now = time.monotonic()
        self._expire(now)
        taken: list[BatchRecord] = []
        lines = 0
        full = False
        while (b := self._peek_returned()) is not None:
            if taken and lines + b.lines > max_lines:
                full = True
                break
            heapq.heappop(self._returned)
            taken.append(b)
            lines += b.lines
        fresh = self._fresh
        while not full and fresh:
            b = fresh[0]
            if taken and lines + b.lines > max_lines:
                break
            fresh.popleft()
            taken.append(b)
            lines += b.lines
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
            if self._has_readable():
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

    # ---- closing -------------------------------------------------------------------------

    async def close(self) -> None:
        """Flush in-flight writes, fsync, persist the read point, release the lock."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._readable.set()  # wake wait_readable callers
        with contextlib.suppress(Exception):  # already logged by _flusher_done
            await self._flusher
        try:
            self._advance()
            await self._persist_read_point()
        except (OSError, JournalError):
            logger.exception("journal: cannot persist the read point on close")
        try:
            await self._loop.run_in_executor(self._write_exec, self._writer.close)
        finally:
            await self._loop.run_in_executor(self._io, self._close_files)
            self._write_exec.shutdown(wait=False)
            self._io.shutdown(wait=False)

    def _close_files(self) -> None:
        try:
            self._rp_file.close()
        finally:
            release_lock(self._lock_fd)

    async def __aenter__(self) -> Journal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

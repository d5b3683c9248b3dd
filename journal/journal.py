"""The journal: durable appends with group commit, and at-least-once reading.

Writers append their framed batch to a pending list and await a future; one
flusher task hands everything pending to a single write thread, which writes it
and fdatasyncs once, then resolves all those futures. A small write that finds
the journal quiet (nothing pending or being written, the last write some
milliseconds ago, fsyncs quick) is written and fdatasync'ed on the event loop
itself instead: the hand-over to the thread and back costs two wake-ups, on an
idle machine more than the fsync. Only then do the batches
become visible to readers, who reserve whole batches, read them (from memory
when still cached, else from the segment file) and rsync them, which advances
and persists the read point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from queue_daemon.journal.errors import JournalError, JournalUnavailable
from queue_daemon.journal.format import EncodedBatch, encode_batch
from queue_daemon.journal.models import BatchRecord, Reservation
from queue_daemon.journal.reader import JournalReader
from queue_daemon.journal.readpoint import ReadPointFile
from queue_daemon.journal.recovery import Recovered, recover
from queue_daemon.journal.segments import (
    FatalWriteError,
    SegmentWriter,
    release_lock,
)

logger = logging.getLogger(__name__)

# Below this many free bytes on the journal's file system an add cannot count on
# being written: readiness says so before the writes start failing.
LOW_SPACE_BYTES = 1 << 20
# A write is made on the event loop (not the write thread) when the last one ended
# at least INLINE_QUIET_S ago, it is at most INLINE_MAX_BYTES, no segment is due to
# be made, and the writes lately took less than INLINE_SLOW_S on average (a slow
# disk keeps them off the loop). At 100 adds/s this blocks the loop about 3% of
# the time; above ~200 adds/s writes go to the thread and are grouped.
INLINE_QUIET_S = 0.005
INLINE_MAX_BYTES = 64 << 10
INLINE_SLOW_S = 0.002


@dataclass(slots=True)
class _PendingWrite:
    batch: EncodedBatch
    create_ms: int
    future: asyncio.Future[None]
    tag: object


class Journal(JournalReader):
    """A durable local append-only journal in one directory (see docs/architecture.md)."""

    def __init__(
        self,
        path: Path,
        recovered: Recovered,
        *,
        io_executor: ThreadPoolExecutor,
        segment_bytes: int,
        cache_bytes: int,
        inline: bool = True,
    ) -> None:
        self.path = path
        self._inline_ok = inline  # quiet writes may be made on the loop
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
        self._inline = False  # a write on the loop between its hand-over and its fsync
        self._flushing = False  # the write thread has a write
        self._write_s = 0.0  # writes' duration, a moving average
        self._last_end = float("-inf")  # time.monotonic() when the last write ended
        self._closed = False
        self._broken: str | None = None
        # the last write that failed (disk full, quota) and the free space then;
        # cleared by the next write that succeeds
        self._failed: tuple[str, int] | None = None
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
        cls,
        path: Path,
        *,
        segment_bytes: int = 64 << 20,
        cache_bytes: int = 64 << 20,
        inline: bool = True,
    ) -> Journal:
        """Create the directory if missing, lock it (JournalInUse if held), recover.

        ``cache_bytes`` bounds the bodies of written batches kept in memory for
        readers; ``inline`` False makes every write on the write thread.
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
            path,
            recovered,
            io_executor=io,
            segment_bytes=segment_bytes,
            cache_bytes=cache_bytes,
            inline=inline,
        )

    # ---- writing -------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False once closed or after a failed fsync (writes raise JournalUnavailable)."""
        return not self._closed and self._broken is None

    def write_problem(self) -> str | None:
        """Why an add cannot be written now, or None: closed, broken by a failed
        fsync, its file system (nearly) full, or the last write failed and no space
        was freed since."""
        if self._closed:
            return f"journal {self.path} is closed"
        if self._broken is not None:
            return self._broken
        free = _free_bytes(self.path)
        if free is not None and free < LOW_SPACE_BYTES:
            return f"the journal's file system is full ({free:,} bytes free)"
        if self._failed is not None:
            message, free_then = self._failed
            if free is None or free <= free_then:
                return message
        return None

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
        opts: str = "",
        tag: object = None,
    ) -> None:
        """Append one batch; return once it is durable (fdatasync'ed).

        ``tag``, kept in memory only, is handed to the reader of the batch with it
        (``BatchRecord.tag``) until it is rsync'ed; a batch read after a restart
        has none. ValueError on bad input, JournalUnavailable if it cannot be
        written. If the caller is cancelled the batch may still be written.
        """
        if self._closed:
            raise JournalUnavailable(f"journal {self.path} is closed")
        if self._broken is not None:
            raise JournalUnavailable(self._broken)
        batch = encode_batch(
            self._seq + 1, type, ids, payloads, create_ms=create_ms, dt_ms=dt_ms, opts=opts
        )
        self._seq += 1
        future: asyncio.Future[None] = self._loop.create_future()
        inline = self._may_inline(len(batch.record))
        item = _PendingWrite(batch, create_ms, future, tag)
        self._pending.append(item)
        if not inline:
            self._wake.set()
        else:
            self._inline = True
            try:
                await asyncio.sleep(0)  # what the add started first (its early insert) goes out
                # its own batch only: those added meanwhile go to the thread next
                self._pending.remove(item)
                await self._flush([item], inline=True)  # (no await inside: blocks the loop)
            except asyncio.CancelledError:
                future.cancel()  # the thread writes it still
                raise
            finally:
                self._inline = False
                if self._pending or self._closed:
                    self._wake.set()
        await future

    def _may_inline(self, size: int) -> bool:
        return (
            self._inline_ok
            and not self._pending
            and not self._flushing
            and not self._inline
            and size <= INLINE_MAX_BYTES
            and self._write_s < INLINE_SLOW_S
            and time.monotonic() - self._last_end >= INLINE_QUIET_S
            and not self._writer.rotation_due
        )

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending and not self._inline:
                items, self._pending = self._pending, []
                self._flushing = True
                try:
                    await self._flush(items)
                finally:
                    self._flushing = False
            if self._closed and not self._inline:
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

    async def _flush(self, items: list[_PendingWrite], *, inline: bool = False) -> None:
        if self._broken is not None:
            self._fail(items, JournalUnavailable(self._broken))
            return
        records = [item.batch.record for item in items]
        began = time.monotonic()
        try:
            if inline:
                segment, offset, _ = self._writer.append(records)
            else:
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
            self._failed = (str(e), _free_bytes(self.path) or 0)
            self._fail(items, e)
            return
        except Exception as e:  # unknown state of the file: same as a failed fsync
            self._broken = f"journal write failed: {e!r}"
            logger.exception("journal: write failed", extra={"action": "journal_broken"})
            self._fail(items, JournalUnavailable(self._broken))
            return
        finally:
            self._last_end = end = time.monotonic()
            self._write_s += (end - began - self._write_s) / 4
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
                tag=item.tag,
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
        self._failed = None
        self._readable.set()
        for item in items:
            if not item.future.done():
                item.future.set_result(None)

    @staticmethod
    def _fail(items: list[_PendingWrite], error: BaseException) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)

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


def _free_bytes(path: Path) -> int | None:
    """Bytes this process may still write on ``path``'s file system (root may use
    the blocks reserved for it), or None when that cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize

"""Segment files: listing, appending with fdatasync, reading back, deleting.

Everything here blocks; the journal calls it from its executors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import zlib
from collections.abc import Iterable
from pathlib import Path

from queue_daemon.journal.errors import JournalError, JournalInUse, JournalUnavailable
from queue_daemon.journal.format import parse_segment_name, segment_name

LOCK_FILE = "lock"


class FatalWriteError(JournalUnavailable):
    """The segment's state on disk is unknown (failed fsync): never write to it again."""


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_segments(directory: Path) -> list[int]:
    numbers = (parse_segment_name(name) for name in os.listdir(directory))
    return sorted(n for n in numbers if n is not None)


def delete_segments(directory: Path, numbers: Iterable[int]) -> None:
    for n in numbers:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / segment_name(n))
    fsync_dir(directory)


def create_segment(directory: Path, number: int) -> None:
    fd = os.open(directory / segment_name(number), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    fsync_dir(directory)


def acquire_lock(directory: Path) -> int:
    """An exclusive flock on PATH/lock, held as long as the returned fd is open."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalInUse(f"journal {directory} is in use by another process") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_lock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def read_bodies(directory: Path, wanted: list[tuple[int, int, int, int]]) -> list[str]:
    """Bodies at (segment, body_offset, body_len, crc), verified and decoded."""
    out: list[str] = []
    fds: dict[int, int] = {}
    try:
        for seg, offset, length, crc in wanted:
            fd = fds.get(seg)
            if fd is None:
                try:
                    fd = fds[seg] = os.open(directory / segment_name(seg), os.O_RDONLY)
                except FileNotFoundError:
                    raise JournalError(f"segment {segment_name(seg)} is gone") from None
            data = os.pread(fd, length, offset)
            if len(data) != length or zlib.crc32(data) != crc:
                raise JournalError(f"batch at {segment_name(seg)}:{offset} changed on disk")
            out.append(data.decode())
    finally:
        for fd in fds.values():
            os.close(fd)
    return out


class SegmentWriter:
    """Appends to the newest segment; used by one thread at a time (the journal's
    write thread, or its event loop for a write made there)."""

    def __init__(
        self, directory: Path, segment: int, size: int, segment_bytes: int, rotate: bool
    ) -> None:
        self.directory = directory
        self.segment = segment
        self.size = size
        self.segment_bytes = segment_bytes
        self.fsync_count = 0
        self.broken = False
        self._rotate_next = rotate
        self._fd = os.open(directory / segment_name(segment), os.O_WRONLY)

    def _rotate(self) -> None:
        new = self.segment + 1
        try:
            fd = os.open(
                self.directory / segment_name(new), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
            )
        except OSError as e:
            raise JournalUnavailable(f"cannot create segment {segment_name(new)}: {e}") from e
        try:
            fsync_dir(self.directory)
        except OSError as e:
            os.close(fd)
            self.broken = True
            raise FatalWriteError(f"fsync of the journal directory failed: {e}") from e
        os.close(self._fd)  # already fdatasync'ed by the flush that wrote it
        self._fd, self.segment, self.size = fd, new, 0
        self._rotate_next = False

    @property
    def rotation_due(self) -> bool:
        """The next append makes a new segment first."""
        return self._rotate_next or (self.size >= self.segment_bytes and self.size > 0)

    def append(self, records: list[bytes]) -> tuple[int, int, int | None]:
        """Write records contiguously and fdatasync once.

        Returns (segment, offset of the first record, new segment number if rotated).
        A failed write is truncated away (JournalUnavailable: retry later is fine);
        a failed fsync raises FatalWriteError.
        """
        if self._fd < 0 or self.broken:
            raise FatalWriteError("the journal's segment is closed or broken")
        rotated: int | None = None
        if self.rotation_due:
            self._rotate()
            rotated = self.segment
        data = b"".join(records)
        start = self.size
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += os.pwrite(self._fd, view[done:], start + done)
        except OSError as e:
            try:
                os.ftruncate(self._fd, start)
            except OSError as e2:
                self.broken = True
                raise FatalWriteError(f"journal write failed ({e}), cleanup failed: {e2}") from e
            raise JournalUnavailable(f"journal write failed: {e}") from e
        try:
            os.fdatasync(self._fd)
        except OSError as e:
            # The kernel may have dropped the dirty pages: retrying would lie.
            self.broken = True
            raise FatalWriteError(f"journal fdatasync failed: {e}") from e
        finally:
            self.fsync_count += 1
        self.size += len(data)
        return self.segment, start, rotated

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                if not self.broken:
                    os.fdatasync(fd)
            finally:
                os.close(fd)

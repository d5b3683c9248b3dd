"""The durable read point: where ingestion resumes after a restart.

``PATH/read-point`` is an append-only text file of records
``<segment> <offset> <seq> <crc32 8 hex>\\n``; the last valid record wins, so a
torn append falls back to the previous (older, hence safe) point. It is
rewritten via tmp + fsync + rename when it grows. Used from one thread at a time.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from queue_daemon.journal.segments import fsync_dir

READ_POINT_FILE = "read-point"
_REWRITE_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class ReadPoint:
    """Everything before (segment, offset) is ingested; seq: highest batch seq seen."""

    segment: int
    offset: int
    seq: int = 0

    @property
    def position(self) -> tuple[int, int]:
        return (self.segment, self.offset)


def _encode(rp: ReadPoint) -> bytes:
    text = f"{rp.segment} {rp.offset} {rp.seq}"
    return f"{text} {zlib.crc32(text.encode()):08x}\n".encode()


def parse_read_point_file(data: bytes) -> ReadPoint | None:
    """The last valid record of a read-point file's bytes."""
    found: ReadPoint | None = None
    for line in data.split(b"\n")[:-1]:  # a last piece without "\n" is torn
        parts = line.split(b" ")
        if len(parts) != 4:
            continue
        text = b" ".join(parts[:3])
        try:
            if int(parts[3], 16) != zlib.crc32(text):
                continue
            seg, off, seq = (int(p) for p in parts[:3])
        except ValueError:
            continue
        found = ReadPoint(seg, off, seq)
    return found


def load_read_point(directory: Path) -> ReadPoint | None:
    try:
        data = (directory / READ_POINT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return parse_read_point_file(data)


class ReadPointFile:
    """Appends read points durably (blocking: call from an executor)."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._path = directory / READ_POINT_FILE
        self._fd = -1
        self._size = 0
        self._dirty = True  # the file must be rewritten before the next append

    def rewrite(self, rp: ReadPoint) -> None:
        """Replace the file by one record, atomically."""
        self.close()
        tmp = self._path.with_suffix(".tmp")
        data = _encode(rp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        fsync_dir(self._dir)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)
        self._dirty = False

    def append(self, rp: ReadPoint) -> None:
        if self._dirty or self._size >= _REWRITE_BYTES:
            self.rewrite(rp)
            return
        data = _encode(rp)
        try:
            if os.write(self._fd, data) != len(data):
                raise OSError("short write to the read-point file")
            os.fdatasync(self._fd)
        except OSError:
            self._dirty = True  # never fsync this fd again; start a fresh file next time
            raise
        self._size += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

"""The queue logfile on disk: whole lines appended by one writer thread, rotated
by size and at UTC midnight, rotated files gzipped in another thread."""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Rotation:
    """When the live file is renamed aside and a new one started."""

    logfile_max_bytes: int = DEFAULT_MAX_BYTES  # 0 = never by size
    logfile_daily: bool = True  # at the first write after UTC midnight
    logfile_gzip: bool = False  # compress rotated files (in another thread)


class LogFile:
    """The live file at ``path`` and its rotations; every method but ``__init__``
    runs on the one writer thread (or blocks: call it through a thread)."""

    def __init__(self, path: Path, rotation: Rotation) -> None:
        self.path = path
        self.rotation = rotation
        self._compressor: ThreadPoolExecutor | None = None
        self._fd = -1
        self._file_bytes = 0
        self._file_day = ""
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        info = os.fstat(self._fd)
        self._file_bytes = info.st_size
        when = info.st_mtime if info.st_size else time.time()
        self._file_day = datetime.fromtimestamp(when, UTC).strftime("%Y%m%d")

    def close(self) -> None:
        """Close the live file (blocking)."""
        self._close_fd()

    def wait_compressed(self) -> None:
        """Blocking: until the compressions of rotated files are done."""
        if self._compressor is not None:
            self._compressor.shutdown(wait=True)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def write(self, data: bytes, sync: bool) -> None:
        """Blocking: append ``data`` (whole lines), rotating as due; fsync with ``sync``."""
        view = memoryview(data)
        while view:
            if self._fd < 0:
                self._open()
            if self._due_by_day():
                self._rotate()
            chunk = self._fitting(view)
            _write_all(self._fd, chunk)
            self._file_bytes += len(chunk)
            view = view[len(chunk) :]
        if sync and self._fd >= 0:
            os.fsync(self._fd)

    def _due_by_day(self) -> bool:
        if not self.rotation.logfile_daily or not self._file_bytes:
            return False
        return datetime.now(UTC).strftime("%Y%m%d") != self._file_day

    def _fitting(self, view: memoryview) -> memoryview:
        """The leading whole lines of ``view`` that fit the size limit; rotates
        first when not even one line fits a non-empty file."""
        limit = self.rotation.logfile_max_bytes
        if not limit or self._file_bytes + len(view) <= limit:
            return view
        room = limit - self._file_bytes
        cut = bytes(view[: max(room, 0)]).rfind(b"\n") + 1 if room > 0 else 0
        if cut:
            return view[:cut]
        if self._file_bytes:
            self._rotate()
            return self._fitting(view)
        # an empty file and a first line over the limit: the line goes in whole
        end = bytes(view).find(b"\n") + 1
        return view[: end or len(view)]

    def _rotate(self) -> None:
        """Rename the live file aside as ``NAME.YYYYmmddTHHMMSSZ`` and start a new one."""
        os.fsync(self._fd)
        self._close_fd()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        n = 1
        while target.exists() or target.with_name(target.name + ".gz").exists():
            target = self.path.with_name(f"{self.path.name}.{stamp}-{n}")
            n += 1
        os.rename(self.path, target)
        self._open()
        logger.info("queue log rotated to %s", target.name, extra={"action": "queuelog_rotated"})
        if self.rotation.logfile_gzip:
            self._compress(target)

    def _compress(self, path: Path) -> None:
        if self._compressor is None:
            self._compressor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="queuelog-gzip")
        self._compressor.submit(compress, path)

    def compress_leftovers(self) -> None:
        """Compress rotated files a stopped daemon left uncompressed (blocking: the
        listing; the compression runs in the background)."""
        if not self.rotation.logfile_gzip:
            return
        for path in sorted(self.path.parent.glob(f"{self.path.name}.2*")):
            if path.suffix not in (".gz", ".partial") and path.is_file():
                self._compress(path)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def compress(path: Path) -> None:
    """``path`` → ``path.gz`` (written aside, then renamed), then remove ``path``.
    A crash in between leaves ``path`` whole; ``compress_leftovers`` finishes it."""
    target = path.with_name(path.name + ".gz")
    # hidden (a leading dot): a glob of queue-*.log* never reads a half-written copy
    partial = path.with_name(f".{path.name}.gz.partial")
    try:
        with path.open("rb") as src:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
            with open(partial, "rb") as done:
                os.fsync(done.fileno())
        os.rename(partial, target)
        os.unlink(path)
    except OSError as exc:
        logger.warning(
            "rotated queue log %s not compressed: %s",
            path,
            exc,
            extra={"action": "queuelog_gzip_failed"},
        )
        with contextlib.suppress(OSError):
            os.unlink(partial)

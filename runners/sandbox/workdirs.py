"""Each daemon's own part of the work root, and the sweep of parts whose daemon died.

Private directories of contexts and shell batches are removed when they end;
a daemon that is killed (SIGKILL, a crash, a power cut) leaves them, with
whatever the handlers wrote, under ``DATA_DIR/run``. So each sandbox works in
``<work root>/d-<id>`` and holds an ``flock`` on ``<work root>/d-<id>.lock`` for
as long as it lives; the kernel drops the lock when the process dies, however
it dies. The next sandbox prepared on the same work root takes every lock it
can get (their owners are gone) and removes those parts.

The lock file is created under a temporary name, locked, and only then renamed
to its final name, so a sweeper never sees a final lock file that nobody holds
yet. Blocking throughout (run from ``Sandbox._prepare`` in a thread).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "d-"
LOCK = ".lock"
TMP = ".tmp-"


def _take(path: Path) -> int | None:
    """An fd holding the exclusive lock of ``path``, or None if another process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def sweep(work_root: Path) -> list[Path]:
    """Remove the parts of daemons that are gone; the removed directories."""
    removed = []
    for entry in sorted(work_root.iterdir()):
        name = entry.name
        if name.startswith(TMP + PREFIX) and name.endswith(LOCK):
            fd = _take(entry)  # a daemon died between creating and renaming its lock
            if fd is not None:
                entry.unlink(missing_ok=True)
                os.close(fd)
        elif name.startswith(PREFIX) and name.endswith(LOCK):
            fd = _take(entry)
            if fd is None:
                continue  # a live daemon's
            part = entry.with_name(name.removesuffix(LOCK))
            shutil.rmtree(part, ignore_errors=True)
            entry.unlink(missing_ok=True)
            os.close(fd)
            removed.append(part)
        elif (
            name.startswith(PREFIX) and entry.is_dir() and not entry.with_name(name + LOCK).exists()
        ):
            shutil.rmtree(entry, ignore_errors=True)  # its lock went first in a sweep cut short
            removed.append(entry)
    if removed:
        logger.info(
            "removed %d private director%s left by daemons that died: %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            ", ".join(str(path) for path in removed),
            extra={"action": "work_dirs_swept"},
        )
    return removed


class OwnPart:
    """This sandbox's ``d-<id>`` directory, held by an flock until ``release``."""

    def __init__(self, path: Path, lock: Path, fd: int) -> None:
        self.path = path
        self._lock = lock
        self._fd: int | None = fd

    @classmethod
    def claim(cls, work_root: Path) -> OwnPart:
        """Sweep the parts of dead daemons, then make and lock a part of our own."""
        sweep(work_root)
        ident = secrets.token_hex(6)
        tmp = work_root / f"{TMP}{PREFIX}{ident}{LOCK}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock = work_root / f"{PREFIX}{ident}{LOCK}"
            os.rename(tmp, lock)
            path = work_root / f"{PREFIX}{ident}"
            path.mkdir(mode=0o711)
            os.chmod(path, 0o711)  # passable by handler users, not listable
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return cls(path, lock, fd)

    def release(self) -> None:
        """Remove the part and its lock (a clean stop leaves nothing to sweep)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None

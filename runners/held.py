"""Held results (runners/PROTOCOL.md, "Held results"): a context whose jobs are
quick writes their results a group at a time, and keeps the group it has not
sent yet in a file the daemon made in the context's directory. When the
context dies or is killed with a group unsent, the daemon reads the group back
from that file: the jobs that finished keep their results, and the job that
was running is the one after them.

The file is the tenant's to write (the handler runs in the same process): what
is read back is a result only where it names the job the daemon expects next,
in order, as a frame on the pipe would (and bounded by the file's size).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from queue_daemon.runners.errors import ProtocolError
from queue_daemon.runners.framing import split
from queue_daemon.runners.models import JobInput

logger = logging.getLogger(__name__)

HELD_FILE = ".qd-held"
# the length (4 bytes, little-endian) then the frames held; the python bootstrap,
# which imports nothing of the project, says the same (python_frames.Held.SIZE)
HELD_SIZE = 64 << 10
_LENGTH = 4


class HeldFile:
    """A context's held-results file, read through the descriptor the daemon opened
    when it made it (a rename or a link put in its place is never followed)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def create(cls, home: Path, owner: tuple[int, int] | None) -> HeldFile | None:
        """The file of a new context (owned by its user); None if it cannot be made
        (the context then sends each result as it comes)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(home / HELD_FILE, flags, 0o600)
        except OSError as exc:
            logger.warning("no held-results file in %s: %s", home, exc)
            return None
        try:
            os.ftruncate(fd, HELD_SIZE)
            if owner is not None:
                os.fchown(fd, *owner)
        except OSError as exc:
            os.close(fd)
            logger.warning("no held-results file in %s: %s", home, exc)
            return None
        return cls(fd)

    def anything(self) -> bool:
        """Whether the context holds results now."""
        try:
            return self._fd is not None and os.pread(self._fd, _LENGTH, 0) not in (
                b"",
                b"\0\0\0\0",
            )
        except OSError:
            return False

    def read_back(
        self, running: JobInput | None, jobs: Sequence[JobInput], index: int
    ) -> list[dict[str, Any]]:
        """The results held in the file of a context that stopped: those of the jobs
        from ``running`` (or ``jobs[index]`` when none runs) on, in order. Results
        the pipe already brought (a group written just before the context died,
        still in the file) are left out."""
        try:
            data = os.pread(self._fd, HELD_SIZE, 0) if self._fd is not None else b""
        except OSError:
            return []
        used = int.from_bytes(data[:_LENGTH], "little")
        if used > len(data) - _LENGTH:
            return []
        try:
            messages, _ = split(data[_LENGTH : _LENGTH + used])
        except ProtocolError:
            return []
        order = ([running] if running is not None else []) + list(jobs[index:])
        out: list[dict[str, Any]] = []
        for message in messages:
            if len(out) == len(order):
                break
            if message.get("op") != "result" or message.get("id") != order[len(out)].id:
                if out:
                    break
                continue  # sent already: the next job's result may follow
            out.append(message)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

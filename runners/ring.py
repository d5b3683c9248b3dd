"""The recent lines of a child's stdout/stderr, read continuously so its pipes never fill."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Collection

from queue_daemon.runners.budget import Spend, no_limit

MAX_LINE = 1000  # characters kept of one line
READ_SIZE = 1 << 18  # bytes taken from a pipe at a time


class LineRing:
    """The last ``size`` lines fed to it (each cut to MAX_LINE characters)."""

    __slots__ = ("_lines", "_partial", "total")

    def __init__(self, size: int = 50) -> None:
        self._lines: deque[str] = deque(maxlen=size)
        self._partial = b""
        self.total = 0  # lines seen

    def feed(self, data: bytes) -> None:
        """Take what was read: only the lines the ring keeps are looked at, so a
        flood of lines costs one count and one split from the end, not a step per line."""
        ended = data.count(b"\n")
        if not ended:
            # a line without end is kept only up to what can be shown
            self._partial = (self._partial + data)[: MAX_LINE * 4]
            return
        self.total += ended
        keep = self._lines.maxlen or ended
        *complete, rest = data.rsplit(b"\n", min(ended, keep + 1))
        if ended <= keep:  # the first of them continues the partial line
            complete[0] = self._partial + complete[0]
        for raw in complete[-keep:]:
            self._lines.append(_text(raw))
        self._partial = rest[: MAX_LINE * 4]

    def close(self) -> None:
        if self._partial:
            self._lines.append(_text(self._partial))
            self.total += 1
            self._partial = b""

    def lines(self) -> list[str]:
        return list(self._lines)

    def tail(self, count: int) -> list[str]:
        lines = list(self._lines)
        return lines[-count:] if count else []


def _text(raw: bytes) -> str:
    return raw[: MAX_LINE * 4].decode("utf-8", "replace").rstrip("\r")[:MAX_LINE]


async def drain(stream: asyncio.StreamReader, ring: LineRing, spend: Spend = no_limit) -> None:
    """Read ``stream`` into ``ring`` until end of stream, ``spend`` after each read
    (``queue_daemon.runners.budget``: it waits while the tenant's output budget is spent)."""
    while True:
        data = await stream.read(READ_SIZE)
        if not data:
            ring.close()
            return
        ring.feed(data)
        await spend(len(data))


async def finish_reading(
    tasks: Collection[asyncio.Task[None]], grace: float
) -> list[BaseException]:
    """Wait up to ``grace`` seconds for the tasks reading a child's pipes (they end
    once the child and its group are gone), cancel those still running (a process
    that left the group still holds the pipe); what the others failed with."""
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        task.cancel()
    ended = await asyncio.gather(*tasks, return_exceptions=True)
    return [
        e
        for e in ended
        if isinstance(e, BaseException) and not isinstance(e, asyncio.CancelledError)
    ]

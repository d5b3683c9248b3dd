"""The recent lines of a child's stdout/stderr, read continuously so its pipes never fill."""

from __future__ import annotations

import asyncio
from collections import deque

MAX_LINE = 1000  # characters kept of one line


class LineRing:
    """The last ``size`` lines fed to it (each cut to MAX_LINE characters)."""

    __slots__ = ("_lines", "_partial", "total")

    def __init__(self, size: int = 50) -> None:
        self._lines: deque[str] = deque(maxlen=size)
        self._partial = b""
        self.total = 0  # lines seen

    def feed(self, data: bytes) -> None:
        *complete, rest = (self._partial + data).split(b"\n")
        for raw in complete:
            self._add(raw)
        # a line without end is kept only up to what can be shown
        self._partial = rest[: MAX_LINE * 4]

    def close(self) -> None:
        if self._partial:
            self._add(self._partial)
            self._partial = b""

    def _add(self, raw: bytes) -> None:
        line = raw[: MAX_LINE * 4].decode("utf-8", "replace").rstrip("\r")[:MAX_LINE]
        self._lines.append(line)
        self.total += 1

    def lines(self) -> list[str]:
        return list(self._lines)

    def tail(self, count: int) -> list[str]:
        lines = list(self._lines)
        return lines[-count:] if count else []


async def drain(stream: asyncio.StreamReader, ring: LineRing) -> None:
    """Read ``stream`` into ``ring`` until end of stream."""
    while True:
        data = await stream.read(1 << 16)
        if not data:
            ring.close()
            return
        ring.feed(data)

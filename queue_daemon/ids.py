"""Job ids: unique in the store because each embeds the daemon's leased sysid.

An id is ``<13 hex digits>-<sysid>``: the hex part is a per-daemon counter
that starts at the wall clock in microseconds and never goes backwards, so
ids of one daemon sort by acceptance order.
"""

from __future__ import annotations

import time


class IdGenerator:
    def __init__(self, sysid: str) -> None:
        self._suffix = "-" + sysid
        self._last = 0

    def next_ids(self, n: int) -> list[str]:
        base = max(self._last + 1, time.time_ns() // 1000)
        self._last = base + n - 1
        suffix = self._suffix
        return [f"{i:013x}{suffix}" for i in range(base, base + n)]

"""Job ids: unique in the store because each embeds the daemon's leased sysid.

An id is ``<13 hex digits>-<sysid>``: the hex part is a per-daemon counter
that starts at the wall clock in microseconds and never goes backwards, so
ids of one daemon sort by acceptance order. Ids derived from an
Idempotency-Key or a schedule's tick start with a letter past ``f`` instead
(``domain.jobs.added_once`` tells them apart: ingestion relies on it).
"""

from __future__ import annotations

import hashlib
import time

_LOW_BITS = 12
_BLOCK = 1 << _LOW_BITS


class IdGenerator:
    def __init__(self, sysid: str) -> None:
        self._last = 0
        # the last three hex digits and the suffix, precomputed: an id is then
        # one short prefix per 4096 ids plus a table lookup
        suffix = self._suffix = "-" + sysid
        self._tails = [f"{low:03x}{suffix}" for low in range(_BLOCK)]

    def next_ids(self, n: int) -> list[str]:
        first = max(self._last + 1, time.time_ns() // 1000)
        end = first + n
        self._last = end - 1
        if n < 8:
            return [f"{i:013x}{self._suffix}" for i in range(first, end)]
        tails = self._tails
        ids: list[str] = []
        start = first
        while start < end:
            high = start >> _LOW_BITS
            stop = min(end, (high + 1) << _LOW_BITS)
            prefix = f"{high:010x}"
            low = start & (_BLOCK - 1)
            ids += [prefix + tail for tail in tails[low : low + stop - start]]
            start = stop
        return ids


MAX_KEY = 200  # characters of an Idempotency-Key


def keyed_ids(client: str, key: str, n: int) -> list[str]:
    """The ids of an add that carries ``key``: derived from the tenant and the key
    alone, so the same add repeated (on any daemon, after a crash, while the
    store is down) journals the same ids, and ingestion, idempotent by id, keeps
    the first. They start with ``i``, never a hex digit: no daemon's own id
    (``<13 hex digits>-<sysid>``) is one of them."""
    digest = hashlib.sha256(f"{client}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()
    return [f"i{digest[:24]}-{i}" for i in range(n)]


def tick_id(client: str, schedule: str, version: str, tick_ms: int) -> str:
    """The id of the job a schedule adds at a tick: derived from the tenant, the
    schedule's name and version and the tick alone, so every daemon that adds
    the tick journals the same id and ingestion, idempotent by id, keeps one job.
    They start with ``s``, never a hex digit nor ``i``: no other id is one of them."""
    text = f"{client}\0{schedule}\0{version}\0{tick_ms}"
    return "s" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:26]

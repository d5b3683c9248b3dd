"""The queue logfile: one JSON object per line for each job added, started and finished.

It is the record analytics read (``queue-daemon stats``), not a durability
mechanism: lines are buffered and written in the background, never fsynced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

from store.models import Release

logger = logging.getLogger(__name__)

FLUSH_BYTES = 1 << 20


class QueueLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._parts: list[str] = []
        self._size = 0
        self._wake = asyncio.Event()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="queuelog")

    def added(self, jobtype: str, ids: Sequence[str], at_ms: int) -> None:
        self.event("added", jobtype, ids, at_ms)

    def event(self, kind: str, jobtype: str, ids: Sequence[str], at_ms: int | None = None) -> None:
        """One line per id: ``{"ev": kind, "t": ms, "type": …, "id": …}``."""
        if at_ms is None:
            at_ms = time.time_ns() // 1_000_000
        # ids and jobtypes never need JSON escaping (see names.py and ids.py)
        head = f'{{"ev":"{kind}","t":{at_ms},"type":"{jobtype}","id":"'
        self._append(head + ('"}\n' + head).join(ids) + '"}\n')

    def finished(self, jobtype: str, releases: Sequence[Release]) -> None:
        """One line per run that ended: its outcome, and whether the job is done."""
        at_ms = time.time_ns() // 1_000_000
        self._append(
            "".join(
                orjson.dumps(
                    {
                        "ev": "finished",
                        "t": at_ms,
                        "type": jobtype,
                        "id": r.id,
                        "code": r.code,
                        "exitcode": r.exitcode,
                        "how": r.how.value,
                    }
                ).decode()
                + "\n"
                for r in releases
            )
        )

    def log(self, jobtype: str, job_id: str, lines: Sequence[str]) -> None:
        """What a run printed that was neither a follow-on job nor a status line
        (already bounded by the runner): ``{"ev": "log", …, "lines": […]}``."""
        record = {
            "ev": "log",
            "t": time.time_ns() // 1_000_000,
            "type": jobtype,
            "id": job_id,
            "lines": list(lines),
        }
        self._append(orjson.dumps(record).decode() + "\n")

    def _append(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= FLUSH_BYTES:
            self._wake.set()

    async def run(self, interval: float = 0.2) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        if not self._parts:
            return
        data = "".join(self._parts).encode()
        self._parts.clear()
        self._size = 0
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, _write_all, self._fd, data)
        except OSError as exc:
            logger.warning("queue log write failed: %s", exc, extra={"action": "queuelog_failed"})

    async def close(self) -> None:
        await self.flush()
        os.close(self._fd)
        self._executor.shutdown(wait=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def summarize(paths: Iterable[Path]) -> dict[str, dict[str, int]]:
    """Per jobtype: counts of each event (and each outcome code for finished jobs)."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for path in paths:
        with path.open("rb") as lines:
            for raw in lines:
                try:
                    record = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    table["(unreadable)"]["lines"] += 1
                    continue
                key = record.get("ev", "?")
                if key == "finished" and record.get("code"):
                    key = f"finished_{record['code']}"
                table[str(record.get("type", "?"))][key] += 1
    return {name: dict(counts) for name, counts in sorted(table.items())}

"""The queue logfile: one JSON object per line for every event of a job's life.

It is the record analytics read (``queue-daemon stats``, ``queue_daemon.tools.analytics``),
not a durability mechanism: lines are built on the event loop (plain string
building of fields that never need JSON escaping: ids, sysids, client and type
names, codes), buffered, and written by one background thread. The thread also
rotates the file (by size and at UTC midnight) between whole lines, and
``close()`` writes what is left and fsyncs, so a SIGTERM loses no line.

Every line has ``ev`` (the kind), ``t`` (epoch ms), ``tenant`` and ``type`` (the
stored jobtype ``client-type`` split at its first ``-``); docs/queuelog.md lists each
kind with an example.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from pathlib import Path

import orjson

from queue_daemon.domain.jobs import ExpiredLock, Release, ReleaseHow, Started, epoch_ms
from queue_daemon.domain.names import JobType
from queue_daemon.observe.logfile import LogFile, Rotation
from queue_daemon.observe.records import Ev, record_head

logger = logging.getLogger(__name__)

FLUSH_BYTES = 1 << 20
_RETRY = ReleaseHow.RETRY  # a module constant: enum member lookups are slow on the hot path


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def payload_size(payload: str) -> int:
    """Bytes of a payload line in UTF-8 (without encoding the common ASCII case)."""
    return len(payload) if payload.isascii() else len(payload.encode())


def payload_sizes(payloads: Sequence[str]) -> Iterable[int]:
    if all(map(str.isascii, payloads)):
        return map(len, payloads)
    return map(payload_size, payloads)


def _due_ms(job: Started) -> int:
    if job.due_ms is not None:
        return job.due_ms
    return epoch_ms(job.create_dt)


def _end(worker: str | None) -> str:
    """The end of a started or finished line: the pull worker's name, if any
    (a name is ``[A-Za-z0-9_.:-]``, nothing to escape)."""
    return "}\n" if worker is None else f',"worker":"{worker}"}}\n'


def _str(value: str | None) -> str:
    return "null" if value is None else f'"{value}"'


def _int(value: int | None) -> str:
    return "null" if value is None else str(value)


class QueueLog:
    """The append-only queue logfile of one daemon (``sysid``)."""

    def __init__(self, path: Path, *, sysid: str = "", rotation: Rotation | None = None) -> None:
        self.path = path
        self.sysid = sysid
        self.rotation = rotation or Rotation()
        self._parts: list[str] = []
        self._size = 0
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="queuelog")
        self._sys = f',"sysid":"{sysid}"'
        self._file = LogFile(path, self.rotation)  # touched only by the writer thread

    # --- events (on the event loop; cheap) ----------------------------------

    def added(
        self, jobtype: str, ids: Sequence[str], payloads: Sequence[str], at_ms: int, dt_ms: int
    ) -> None:
        """One line per job accepted: its id and payload size; ``dt`` its eligible time.

        The hot path of adds (1000 lines a request): the lines are joined from
        their constant parts and each job's id and size, without a dict or a
        format call per job."""
        head = record_head(Ev.ADDED, at_ms, jobtype) + ',"id":"'
        tail = f'{self._sys},"dt":{dt_ms}}}\n'
        sizes = map(str, payload_sizes(payloads))
        self._append(
            "".join(map("".join, zip(repeat(head), ids, repeat('","size":'), sizes, repeat(tail))))
        )

    def started(
        self,
        jobtype: str,
        jobs: Sequence[Started],
        at_ms: int | None = None,
        *,
        worker: str | None = None,
    ) -> None:
        """One line per claimed job: its attempt and how long it waited since it was due,
        ``wait_ms = start - max(create time, dt)``; ``worker``: the pull worker
        that claimed it (through this daemon)."""
        at_ms = now_ms() if at_ms is None else at_ms
        head = record_head(Ev.STARTED, at_ms, jobtype) + ',"id":"'
        sys_part = self._sys
        end = _end(worker)
        self._append(
            "".join(
                [
                    f'{head}{job.id}","attempt":{job.attempts}{sys_part},'
                    f'"wait_ms":{max(0, at_ms - _due_ms(job))}{end}'
                    for job in jobs
                ]
            )
        )

    def finished(
        self,
        jobtype: str,
        releases: Sequence[Release],
        *,
        attempts: Mapping[str, int] | None = None,
        run_ms: Mapping[str, float] | None = None,
        worker: str | None = None,
    ) -> None:
        """One line per run that ended (``how``: archive = done, retry, unget = put
        back without counting), and a ``retry`` line for each job that will run again;
        ``worker``: the pull worker that completed them."""
        at_ms = now_ms()
        head = record_head(Ev.FINISHED, at_ms, jobtype) + ',"id":"'
        attempts = attempts or {}
        run_ms = run_ms or {}
        sys_part = self._sys
        end = _end(worker)
        # the code/exitcode/how part repeats within a batch: built once per kind
        # (keyed by identity of the how: hashing an enum member is a Python-level call)
        outcomes: dict[tuple[str | None, int | None, int], tuple[str, str]] = {}
        parts = []
        for r in releases:
            key = (r.code, r.exitcode, id(r.how))
            outcome = outcomes.get(key)
            if outcome is None:
                outcome = outcomes[key] = (
                    f',"code":{_str(r.code)},"exitcode":{_int(r.exitcode)},"run_ms":',
                    f',"how":"{r.how.value}"{end}',
                )
            ran = run_ms.get(r.id)
            attempt = attempts.get(r.id)
            parts.append(
                f'{head}{r.id}","attempt":{"null" if attempt is None else attempt}{sys_part}'
                f"{outcome[0]}{'null' if ran is None else f'{ran:.3f}'}{outcome[1]}"
            )
            if r.how is _RETRY:
                delay = int(r.delay * 1000)
                retry = record_head(Ev.RETRY, at_ms, jobtype)
                parts.append(
                    f'{retry},"id":"{r.id}","attempt":{_int(attempt)}'
                    f'{sys_part},"code":{_str(r.code)},"exitcode":{_int(r.exitcode)},'
                    f'"delay_ms":{delay},"dt":{at_ms + delay}}}\n'
                )
        self._append("".join(parts))

    def lost_lease(
        self,
        jobtype: str,
        releases: Sequence[Release],
        *,
        attempts: Mapping[str, int],
        run_ms: Mapping[str, float],
    ) -> None:
        """Runs that ended after this daemon lost their lease (it stalled, or the
        store was down past it): the store refused their outcome, which another
        run decides. ``code`` and ``exitcode`` are the outcome discarded."""
        at_ms = now_ms()
        head = record_head(Ev.LOST_LEASE, at_ms, jobtype)
        parts = []
        for r in releases:
            ran = run_ms.get(r.id)
            parts.append(
                f'{head},"id":"{r.id}","attempt":{_int(attempts.get(r.id))}{self._sys}'
                f',"code":{_str(r.code)},"exitcode":{_int(r.exitcode)}'
                f',"run_ms":{"null" if ran is None else f"{ran:.3f}"}}}\n'
            )
        self._append("".join(parts))

    def expired(self, jobs: Iterable[ExpiredLock]) -> None:
        """Locks that ran out (a daemon died or stalled): ``(id, jobtype, attempts)``
        of each job made eligible again; ``sysid`` is the daemon that expired them."""
        at_ms = now_ms()
        self._append(
            "".join(
                f'{record_head(Ev.EXPIRED, at_ms, jobtype)},"id":"{job_id}","attempt":{attempts}'
                f"{self._sys}}}\n"
                for job_id, jobtype, attempts, _ in jobs
            )
        )

    def cancelled(self, jobtype: str, job_id: str) -> None:
        self._append(
            f'{record_head(Ev.CANCELLED, now_ms(), jobtype)},"id":"{job_id}"{self._sys}}}\n'
        )

    def tick(
        self, jobtype: str, job_id: str, schedule: str, tick_ms: int, *, catchup: bool
    ) -> None:
        """A schedule's tick added as job ``job_id`` (its ``added`` line is apart);
        ``catchup`` when later ticks were missed and this one stands for them."""
        self._append(
            f'{record_head(Ev.TICK, now_ms(), jobtype)},"id":"{job_id}","schedule":"{schedule}"'
            f',"tick":{tick_ms},"catchup":{"true" if catchup else "false"}{self._sys}}}\n'
        )

    def blocked(self, jobtype: str, ids: Sequence[str], after: int) -> None:
        """Jobs added to wait for ``after`` other jobs (their ``added`` lines are apart)."""
        head = record_head(Ev.BLOCKED, now_ms(), jobtype)
        self._append("".join(f'{head},"id":"{i}","after":{after}{self._sys}}}\n' for i in ids))

    def unblocked(self, jobs: Iterable[tuple[str, str]]) -> None:
        """``(id, jobtype)`` of jobs whose dependencies are all done: they are due."""
        at_ms = now_ms()
        self._append(
            "".join(
                f'{record_head(Ev.UNBLOCKED, at_ms, jobtype)},"id":"{job_id}"{self._sys}}}\n'
                for job_id, jobtype in jobs
            )
        )

    def deadline(self, jobs: Iterable[tuple[str, str, bool]]) -> None:
        """``(id, jobtype, running)`` of jobs whose deadline passed: failed, 408."""
        at_ms = now_ms()
        self._append(
            "".join(
                f'{record_head(Ev.DEADLINE, at_ms, jobtype)},"id":"{job_id}"'
                f',"running":{"true" if running else "false"}{self._sys}}}\n'
                for job_id, jobtype, running in jobs
            )
        )

    def purged(self, counts: Mapping[str, int]) -> None:
        """Archived jobs deleted after the retention time, counted per jobtype."""
        at_ms = now_ms()
        self._append(
            "".join(
                f'{record_head(Ev.PURGED, at_ms, jobtype)},"n":{n}{self._sys}}}\n'
                for jobtype, n in sorted(counts.items())
            )
        )

    def log(self, jobtype: str, job_id: str, lines: Sequence[str]) -> None:
        """What a run printed that was neither a follow-on job nor a status line
        (already bounded by the runner): ``{"ev": "log", …, "lines": […]}``."""
        tenant, name = JobType.parse(jobtype)
        record = {
            "ev": Ev.LOG.value,
            "t": now_ms(),
            "tenant": tenant,
            "type": name,
            "id": job_id,
            "lines": list(lines),
        }
        self._append(orjson.dumps(record).decode() + "\n")

    def _append(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        self._size += len(text)
        if self._size >= FLUSH_BYTES:
            self._wake.set()

    # --- writing (the writer thread does the I/O) ----------------------------

    async def run(self, interval: float = 0.2) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: see worker._claim_loop
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self, *, sync: bool = False) -> None:
        """Hand what is buffered to the writer thread and wait until it is written.

        Buffers are taken in call order and the writer is one thread, so lines
        reach the file in the order they were logged, even when a ``flush`` is
        cancelled (its write still happens)."""
        data = "".join(self._parts).encode()
        self._parts.clear()
        self._size = 0
        if not data and not sync:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._file.write, data, sync)
        except OSError as exc:
            logger.warning("queue log write failed: %s", exc, extra={"action": "queuelog_failed"})

    async def close(self) -> None:
        """Write the rest, fsync, close; wait for compressions of rotated files."""
        await self.flush(sync=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._file.close)
        self._executor.shutdown(wait=True)
        await asyncio.to_thread(self._file.wait_compressed)

    def compress_leftovers(self) -> None:
        """Compress rotated files a stopped daemon left uncompressed (blocking: the
        listing; the compression runs in the background)."""
        self._file.compress_leftovers()

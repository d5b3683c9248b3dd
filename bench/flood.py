"""Tenant isolation under a flood, for the ``flood`` section.

One daemon, two tenants. The calm tenant posts one job at a time (a
``PY_CLOCK`` handler, timed as in the ``latency`` section: the handler returns
``time.time()`` when it starts, compared with the bench's clock just before the
POST), first on the idle daemon (the baseline), then while the flooding tenant
has a deep backlog and keeps adding more at ``add_rate`` jobs/s. The question
is how much the flood raises the calm tenant's add → start latency.

Two kinds of flood: jobs that keep a CPU busy for 20 ms each (``busy_handler``:
the flood takes every core the machine has), and jobs that hold their slot for
a second without using the CPU (``sleepy_handler``: the flood takes every
runner context the daemon may run at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.api import Api
from bench.ceilings import LINE
from bench.e2e import PY_CLOCK, Latency, _post_all, bulk_body, sample_latency
from bench.procs import BenchError

FLOOD_TYPE = "busy"
CALM_TYPE = "clock"
POST_CONNS = 4


def busy_handler(busy_ms: float) -> str:
    """A python handler that keeps a CPU busy for ``busy_ms`` per job (no sleeping:
    it competes for the cores the way real work does)."""
    return (
        "import time\n\n\n"
        "def handler(p, ctx):\n"
        f"    end = time.process_time() + {busy_ms / 1000:.4f}\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
    )


def sleepy_handler(seconds: float) -> str:
    """A python handler that holds its slot (and its context) ``seconds`` per job, idle."""
    return f"import time\n\n\ndef handler(p, ctx):\n    time.sleep({seconds})\n"


class DiskProbe:
    """A small append + fdatasync every ``every`` seconds on the daemon's disk, in a
    thread, timed: each add's ack waits for an fdatasync, and its ingest and claim for
    PostgreSQL's WAL flush, so a disk that stalls now and then sets the p99 of either
    phase. ``take`` returns the times since the last take (ms)."""

    def __init__(self, directory: Path, every: float = 0.02) -> None:
        self._path = directory / "disk-probe.bin"
        self._every = every
        self._times: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)

    def __enter__(self) -> DiskProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._path.unlink(missing_ok=True)

    def _run(self) -> None:
        # first on the CPU where allowed (root): under a CPU flood a thread of normal
        # priority waits for a core after each fdatasync returns, and that wait
        # would be counted as the disk's
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while not self._stop.wait(self._every):
                began = time.perf_counter()
                os.write(fd, LINE)
                os.fdatasync(fd)
                took = 1000 * (time.perf_counter() - began)
                with self._lock:
                    self._times.append(took)
        finally:
            os.close(fd)

    def take(self) -> list[float]:
        with self._lock:
            times, self._times = self._times, []
        return times


@dataclass(slots=True)
class Flood:
    baseline: Latency  # the calm tenant on the idle daemon
    flooded: Latency  # the same while the other tenant floods
    backlog: int  # flood jobs added before the flooded samples
    added: int  # flood jobs added while the calm tenant was measured
    seconds: float  # length of the flooded measurement
    before: dict[str, int]  # the flood type's counts when the flooded samples began
    after: dict[str, int]  # ... and when they ended
    disk_idle: list[float]  # DiskProbe ms, baseline
    disk_flooded: list[float]  # ... flooded samples

    @property
    def flood_done(self) -> int:
        return self.after["done_ok"] - self.before["done_ok"]


async def _keep_adding(
    api: Api, body: bytes, rate: float, stop: asyncio.Event, added: list[int]
) -> None:
    """POST ``body`` every ``lines / rate`` seconds until ``stop``; counts into ``added``."""
    lines = body.count(b"\n")
    interval = lines / rate
    next_at = time.monotonic()
    while not stop.is_set():
        await api.post(FLOOD_TYPE, body)
        added[0] += lines
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


async def _saturated(api: Api, running: int, done: int, within: float) -> dict[str, int]:
    """Wait until at least ``running`` flood jobs run at once and ``done`` are done (the
    daemon knows how long they take: past its first, small batches)."""
    deadline = time.monotonic() + within
    while True:
        counts = await api.stats(FLOOD_TYPE)
        if counts["done_failed"] or counts["done_error"]:
            raise BenchError(f"flood jobs failed: {counts}")
        if counts["running"] >= running and counts["done_ok"] >= done and counts["waiting"] > 0:
            return counts
        if time.monotonic() > deadline:
            raise BenchError(
                f"the flood did not take {running} slots within {within:.0f} s: {counts}"
            )
        await asyncio.sleep(0.5)  # /stats scans the tenant's jobs: not too often


async def measure_flood(
    url: str,
    flooder: tuple[str, str],
    calm: tuple[str, str],
    *,
    backlog: int,
    post_lines: int,
    add_rate: float,
    handler: str,
    samples: int,
    warm: int,
    pause: float,
    saturate: int,
    warmed: int,
    disk: DiskProbe,
) -> Flood:
    """See the module docstring; ``flooder`` and ``calm`` are (client, token), ``handler``
    the flood's python source; the flood is on once ``saturate`` of its jobs run at
    once and ``warmed`` are done."""
    if backlog % post_lines:
        raise BenchError(f"backlog must be a multiple of {post_lines}")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        flood = Api(session, url, flooder[1], flooder[0])
        victim = Api(session, url, calm[1], calm[0])
        await flood.add_handler(FLOOD_TYPE, "python", handler)
        await victim.add_handler(CALM_TYPE, "python", PY_CLOCK)

        print(f"  baseline: {samples} jobs, one at a time, idle daemon ...", flush=True)
        disk.take()
        baseline = await sample_latency(victim, CALM_TYPE, samples=samples, warm=warm, pause=pause)
        disk_idle = disk.take()

        print(f"  flood: {backlog:,} jobs ...", flush=True)
        body = bulk_body(post_lines)
        await _post_all([flood], FLOOD_TYPE, body, backlog // post_lines, POST_CONNS)
        counts = await _saturated(flood, saturate, warmed, 120.0)
        print(
            f"  flood running {counts['running']}, waiting {counts['waiting']:,}; "
            f"adding {add_rate:,.0f} more/s while {samples} calm jobs are timed ...",
            flush=True,
        )
        stop = asyncio.Event()
        added = [0]
        adder = asyncio.create_task(_keep_adding(flood, body, add_rate, stop, added))
        try:
            before = await flood.stats(FLOOD_TYPE)
            disk.take()
            t0 = time.monotonic()
            flooded = await sample_latency(
                victim, CALM_TYPE, samples=samples, warm=warm, pause=pause
            )
            seconds = time.monotonic() - t0
            disk_flooded = disk.take()
            after = await flood.stats(FLOOD_TYPE)
        finally:
            stop.set()
            await adder  # raises what the adder met (a refused POST is a failed section)
        if after["running"] < max(1, saturate // 2) or after["waiting"] == 0:
            raise BenchError(f"the flood ran dry while the calm tenant was measured: {after}")
        return Flood(
            baseline=baseline,
            flooded=flooded,
            backlog=backlog,
            added=added[0],
            seconds=seconds,
            before=before,
            after=after,
            disk_idle=disk_idle,
            disk_flooded=disk_flooded,
        )

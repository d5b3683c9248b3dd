"""Tenant isolation under a flood, for the ``flood`` section.

One daemon, two tenants. The calm tenant posts one job at a time (a
``PY_CLOCK`` handler, timed as in the ``latency`` section: the handler returns
``time.time()`` when it starts, compared with the bench's clock just before the
POST), first on the idle daemon (the baseline), then while the flooding tenant
has a deep backlog and keeps adding more at ``add_rate`` jobs/s. The question
is how much the flood raises the calm tenant's add → start latency.

The disk of a small VM has weather: stalls that come and go over seconds to
minutes, so a p99 taken in one stretch of time and compared with one taken in
another may be comparing the disk more than the flood. So afterwards the
flood is switched off and on in turns (``rounds`` of ``per_round`` calm jobs
each way): off is the flood's handler deleted (its jobs wait; it runs nothing
once its running batches are done) and its adds stopped, on is the handler
added again and the adds resumed. Both sides then see the same weather. The
flood's backlog stays queued in both, which is the difference from the idle
daemon of the first comparison.

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
class Turns:
    """The calm tenant's samples with the flood off and on in turns."""

    off: Latency
    on: Latency
    rounds: int
    disk_off: list[float]
    disk_on: list[float]


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
    turns: Turns | None = None

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


async def _drained(api: Api, within: float) -> None:
    """Wait until no flood job runs (its handler is gone: the rest wait)."""
    deadline = time.monotonic() + within
    while (counts := await api.stats(FLOOD_TYPE))["running"]:
        if time.monotonic() > deadline:
            raise BenchError(f"the flood still ran {within:.0f} s after its handler went: {counts}")
        await asyncio.sleep(0.1)


def _extend(into: Latency, part: Latency) -> None:
    into.starts_ms.extend(part.starts_ms)
    into.acks_ms.extend(part.acks_ms)
    into.seen_ms.extend(part.seen_ms)


async def _turns(
    flood: Api,
    victim: Api,
    *,
    handler: str,
    body: bytes,
    add_rate: float,
    rounds: int,
    per_round: int,
    pause: float,
    saturate: int,
    warmed: int,
    disk: DiskProbe,
) -> Turns:
    """The flood off and on in turns; see the module docstring."""
    turns = Turns(Latency([], [], []), Latency([], [], []), rounds, [], [])
    for _ in range(rounds):
        await flood.del_handler(FLOOD_TYPE)
        await _drained(flood, 120.0)
        disk.take()
        part = await sample_latency(victim, CALM_TYPE, samples=per_round, warm=1, pause=pause)
        turns.disk_off += disk.take()
        _extend(turns.off, part)

        done = (await flood.stats(FLOOD_TYPE))["done_ok"]
        await flood.add_handler(FLOOD_TYPE, "python", handler)
        await _saturated(flood, saturate, done + warmed, 120.0)
        stop = asyncio.Event()
        adder = asyncio.create_task(_keep_adding(flood, body, add_rate, stop, [0]))
        try:
            disk.take()
            part = await sample_latency(victim, CALM_TYPE, samples=per_round, warm=1, pause=pause)
            turns.disk_on += disk.take()
        finally:
            stop.set()
            await adder
        _extend(turns.on, part)
    return turns


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
    rounds: int = 0,
) -> Flood:
    """See the module docstring; ``flooder`` and ``calm`` are (client, token), ``handler``
    the flood's python source; the flood is on once ``saturate`` of its jobs run at
    once and ``warmed`` are done; ``rounds`` of the flood off and on in turns follow
    (none: 0), ``samples // rounds`` calm jobs each way a round."""
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
        turns = None
        if rounds:
            per_round = max(1, samples // rounds)
            print(
                f"  the flood off and on in turns: {rounds} rounds of {per_round} calm jobs "
                "each way ...",
                flush=True,
            )
            turns = await _turns(
                flood,
                victim,
                handler=handler,
                body=body,
                add_rate=add_rate,
                rounds=rounds,
                per_round=per_round,
                pause=pause,
                saturate=saturate,
                warmed=warmed,
                disk=disk,
            )
            final = await flood.stats(FLOOD_TYPE)
            if final["waiting"] == 0:
                raise BenchError(f"the flood ran dry during the turns: {final}")
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
            turns=turns,
        )

"""Cost of the queue log on the hot path, and speed of ``queue-daemon stats``.

- ``added``: lines per second that ``QueueLog.added`` builds on the event loop
  for requests of 1000 jobs (the add path at high rates), and the same for
  ``started`` and ``finished`` (the claim and release paths).
- ``stats``: a log of ``--lines`` generated lines (written by ``QueueLog``
  itself, rotated and gzipped in part) read by ``queue_daemon.tools.analytics``:
  lines per second, and the peak memory of ``queue-daemon stats`` for a tenth
  of the lines and for all of them (constant memory: about the same).

    python -m bench.queuelog [--lines 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

from queue_daemon.domain.jobs import ClaimedJob, Release, ReleaseHow, epoch_ms
from queue_daemon.observe.logfile import Rotation
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.tools.analytics import Analysis, analyze
from queue_daemon.tools.readlog import LogFile

PER_REQUEST = 1000
T0 = 1_795_000_000_000


def _ids(n: int, start: int) -> list[str]:
    return [f"{start + i:013x}-1" for i in range(n)]


async def hot_path(folder: Path, rounds: int = 300) -> dict[str, float]:
    """Lines per second built by each event method (the writer thread excluded)."""
    log = QueueLog(
        folder / "hot.log", sysid="1", rotation=Rotation(logfile_max_bytes=0, logfile_daily=False)
    )
    payloads = ['{"image":"s3://bucket/key-0001.png","w":640}'] * PER_REQUEST
    rates: dict[str, float] = {}
    ids = _ids(PER_REQUEST, 0)
    began = time.perf_counter()
    for _ in range(rounds):
        log.added("acme-resize", ids, payloads, T0, T0)
        log._parts.clear()  # measure building, not the write behind it
    rates["added"] = rounds * PER_REQUEST / (time.perf_counter() - began)

    now = datetime.now(UTC)
    jobs = [
        ClaimedJob(
            id=i, type="acme-resize", data="", attempts=1, created_ms=epoch_ms(now), due_ms=T0
        )
        for i in ids[:200]
    ]
    began = time.perf_counter()
    for _ in range(rounds * 5):
        log.started("acme-resize", jobs)
        log._parts.clear()
    rates["started"] = rounds * 5 * len(jobs) / (time.perf_counter() - began)

    releases = [Release(id=j.id, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200) for j in jobs]
    attempts = {j.id: 1 for j in jobs}
    run_ms = {j.id: 1.234 for j in jobs}
    began = time.perf_counter()
    for _ in range(rounds * 5):
        log.finished("acme-resize", releases, attempts=attempts, run_ms=run_ms)
        log._parts.clear()
    rates["finished"] = rounds * 5 * len(jobs) / (time.perf_counter() - began)
    await log.close()
    return rates


async def write_log(folder: Path, lines: int) -> list[Path]:
    """About ``lines`` lines of 5 tenants and 4 types each: add, start, finish (a few retries)."""
    rng = random.Random(1)
    log = QueueLog(
        folder / "queue-1.log",
        sysid="1",
        rotation=Rotation(logfile_max_bytes=64 << 20, logfile_daily=False, logfile_gzip=True),
    )
    types = [f"t{a}-type{b}" for a in range(5) for b in range(4)]
    written = 0
    n = 0
    base = datetime.fromtimestamp(T0 / 1000, UTC)
    while written < lines:
        jobtype = types[n % len(types)]
        ids = _ids(PER_REQUEST, n * PER_REQUEST)
        at = T0 + n * 50
        log.added(jobtype, ids, ["{}"] * PER_REQUEST, at, at)
        claimed = [
            ClaimedJob(
                id=i,
                type=jobtype,
                data="",
                attempts=1,
                created_ms=epoch_ms(base + timedelta(milliseconds=n * 50)),
            )
            for i in ids
        ]
        log.started(jobtype, claimed)
        releases = [
            Release(id=i, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200)
            if rng.random() > 0.02
            else Release(id=i, how=ReleaseHow.RETRY, code="error", exitcode=500, delay=1.0)
            for i in ids
        ]
        log.finished(jobtype, releases, run_ms={i: rng.expovariate(0.1) for i in ids})
        written += 3 * PER_REQUEST + sum(r.how is ReleaseHow.RETRY for r in releases)
        n += 1
        if n % 20 == 0:
            await log.flush()
    await log.close()
    return await asyncio.to_thread(lambda: sorted(folder.glob("queue-1.log*")))


def read_speed(paths: Sequence[Path]) -> tuple[float, int]:
    """(lines per second, lines) of one pass of the analytics in this process."""
    began = time.perf_counter()
    analysis = analyze(paths, Analysis())
    elapsed = time.perf_counter() - began
    return analysis.lines / elapsed, analysis.lines


def parse_ceiling(paths: Sequence[Path]) -> float:
    """Lines per second of reading and ``orjson.loads`` alone (no aggregation)."""
    began = time.perf_counter()
    lines = 0
    for path in paths:
        with LogFile(path) as log:
            for raw in log.lines:
                orjson.loads(raw)
                lines += 1
    return lines / (time.perf_counter() - began)


def stats_rss(paths: Sequence[Path]) -> float:
    """Peak RSS in MiB of ``queue-daemon stats --json PATHS`` in a process of its own
    (the largest of this process's children so far: call with growing inputs)."""
    subprocess.run(
        [sys.executable, "-m", "queue_daemon", "stats", "--json", *map(str, paths)],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queuelog", description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="qd-bench-log-") as tmp:
        folder = Path(tmp)
        rates = asyncio.run(hot_path(folder))
        for name, rate in rates.items():
            print(f"queue log {name}(): {rate:,.0f} lines/s built on the event loop")
        paths = asyncio.run(write_log(folder, args.lines))
        size = sum(p.stat().st_size for p in paths) / (1 << 20)
        rate, lines = read_speed(paths)
        ceiling = parse_ceiling(paths)
        print(
            f"stats: {lines:,} lines in {len(paths)} files ({size:,.0f} MiB on disk, "
            f"{sum(p.suffix == '.gz' for p in paths)} gzipped): {rate:,.0f} lines/s "
            f"(reading and orjson.loads alone: {ceiling:,.0f} lines/s)"
        )
        (folder / "small").mkdir()
        small = asyncio.run(write_log(folder / "small", args.lines // 10))
        print(
            f"stats peak memory: {stats_rss(small):,.0f} MiB for {args.lines // 10:,} lines, "
            f"{stats_rss(paths):,.0f} MiB for {lines:,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

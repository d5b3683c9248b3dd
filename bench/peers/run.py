"""``python -m bench --peers``: this project beside pgqueuer, procrastinate and
graphile-worker, measured in one run, one after the other, on one PostgreSQL server
with the same settings (each system on a fresh database of its own); ``--peer NAME``
runs only the peers named.

Workloads (``--quick``: smaller, for a smoke run):

  enqueue 1      one job per call for --duration seconds after a warm-up
  enqueue 1000   batches of 1,000 a call
  e2e            100,000 no-op jobs enqueued first (no worker yet; this project:
                 its type paused, its contexts warm), then the workers start
                 (this project: the type is resumed); time until all are done
  latency        add → start p50 / p99 at a steady 100 jobs/s, 20 s; the median of
                 --repeat runs (3), this project and each close peer in turn
  e2e deep       the e2e workload while 1,000,000 jobs wait in another queue

The Python peers run from their own virtual environment (``bench/peers/venv.py``,
driven by ``driver.py``), graphile-worker on the project's node with the packages
pinned in ``package-lock.json`` (``bench/peers/node_env.py``, driven by
``graphile_driver.mjs``, which speaks ``driver.py``'s roles); each the way its
documentation shows, with the worker and batch settings of ``PEERS`` below
(printed with the results). A peer's e2e that has not finished
within ``E2E_LIMIT_S`` (--quick: a quarter) is stopped and its rate is what it did until then.

The table is printed, written as JSON (``bench/results/peers-<date>-<time>.json``,
kept in git as history) and drawn as a PNG beside it (matplotlib, in the peers'
environment). The ratio of each row is this project / the best peer, so that
above 1 this project is ahead: for the latency rows, best peer / this project.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from bench.peers import node_env, ours
from bench.peers import venv as peer_venv
from bench.peers.report import machine, render, write
from bench.peers.rows import Sizes, measure
from bench.pg import vacuum_analyze
from bench.procs import ROOT, BenchError, Child

if TYPE_CHECKING:
    from bench.cli import Run

RESULTS = ROOT / "bench" / "results"
E2E_LIMIT_S = 240.0
STARTUP_S = 3.0  # enqueue processes connect before the measured window


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """How a peer is run: processes x connections (or workers) per process, batch."""

    enqueue1: tuple[int, int]  # processes, connections each (one call in flight on each)
    enqueue1000: tuple[int, int]
    # worker shapes tried (processes, concurrency each, dequeue batch): the
    # fastest on a short end to end runs the e2e workloads
    work: tuple[tuple[int, int, int], ...]
    tune_jobs: int  # jobs of each try
    latency: tuple[int, int]  # concurrency, dequeue batch (one worker process)
    flags: tuple[str, ...] = ()
    note: str = ""

    def describe(self) -> str:
        p1, c1 = self.enqueue1
        pb, cb = self.enqueue1000
        shapes = ", ".join(f"{p} x {c} x {b}" for p, c, b in self.work)
        lc, lb = self.latency
        flags = f", {' '.join(self.flags)}" if self.flags else ""
        return (
            f"enqueue {p1} processes x {c1} connections (1 a call), {pb} x {cb} (1,000 a call); "
            f"workers (processes x concurrency x dequeue batch) the fastest of {shapes} "
            f"on {self.tune_jobs:,} jobs; latency 1 process x {lc}, "
            f"batch {lb}{flags}. {self.note}"
        ).strip()


NODE_PEER = "graphile-worker"  # run by node (graphile_driver.mjs), the others by python

PEERS: dict[str, PeerSettings] = {
    # as pgqueuer's tools/benchmark.py runs it: several PgQueuer instances in one
    # process, each on its own asyncpg connection, with uvloop
    "pgqueuer": PeerSettings(
        enqueue1=(2, 16),
        enqueue1000=(2, 2),
        work=((1, 5, 10), (1, 5, 100), (2, 5, 10), (2, 5, 100), (2, 10, 100)),
        tune_jobs=20_000,
        latency=(5, 10),
        flags=("--uvloop",),
        note="PgQueuer instances (dequeue tasks) run in drain mode.",
    ),
    # procrastinate's worker takes one job per fetch (its batch is always 1)
    "procrastinate": PeerSettings(
        enqueue1=(2, 16),
        enqueue1000=(2, 2),
        work=((1, 1, 1), (2, 1, 1), (1, 4, 1), (2, 4, 1)),
        tune_jobs=2_000,
        latency=(1, 1),
        note="Workers with wait=False (stop once the queue is empty), listen/notify on.",
    ),
    # as its documentation's performance page: processes x concurrentJobs x
    # localQueue.size (0: no local queue), completeJobBatchDelay and
    # failJobBatchDelay 0; its page's own shape is 24 x 500
    NODE_PEER: PeerSettings(
        enqueue1=(2, 16),
        enqueue1000=(2, 2),
        work=((2, 24, 500), (1, 24, 500), (2, 50, 1000), (1, 10, 0)),
        tune_jobs=50_000,
        latency=(24, 500),
        note=(
            "Jobs added with WorkerUtils addJob (1 a call) / addJobs; concurrency is "
            "concurrentJobs, the dequeue batch localQueue.size (0: none), "
            "completeJobBatchDelay and failJobBatchDelay 0; the end to end drains with "
            "runOnce (its --once), the latency worker is run() with LISTEN/NOTIFY."
        ),
    ),
}

# jobs of the bench's queue not yet done, per peer
REMAINING_SQL = {
    "pgqueuer": "SELECT count(*) FROM pgqueuer WHERE entrypoint = 'noop'",
    "procrastinate": (
        "SELECT count(*) FROM procrastinate_jobs "
        "WHERE queue_name = 'default' AND status <> 'succeeded'"
    ),
    # a job done is deleted; a failed one stays (with its error)
    NODE_PEER: (
        "SELECT count(*) FROM graphile_worker._private_jobs j "
        "JOIN graphile_worker._private_tasks t ON t.id = j.task_id WHERE t.identifier = 'noop'"
    ),
}


class PeerRunner:
    """Runs the driver of one peer against databases of the bench's server;
    ``driver`` is the argv that starts it (``driver.py`` in the peers' python, or
    ``graphile_driver.mjs`` in node), the role and its arguments follow."""

    def __init__(self, run: Run, driver: Sequence[str], name: str) -> None:
        self.run = run
        self.driver = list(driver)
        self.name = name
        self.settings = PEERS[name]
        self.shape = self.settings.work[0]
        self.tuned = ""
        self.limit_s = E2E_LIMIT_S / 4 if run.opts.quick else E2E_LIMIT_S

    def _argv(self, role: str, dsn: str, *args: str) -> list[str]:
        return [
            *self.driver,
            role,
            "--peer",
            self.name,
            "--dsn",
            dsn,
            *self.settings.flags,
            *args,
        ]

    def _child(self, label: str, role: str, dsn: str, *args: str) -> Child:
        return Child(f"{self.name}-{label}", self._argv(role, dsn, *args), log_dir=self.run.work)

    @staticmethod
    def _result(child: Child, timeout: float) -> dict[str, Any]:
        line = child.wait_line("RESULT ", timeout=timeout)
        found: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        return found

    def _once(self, label: str, role: str, dsn: str, *args: str, timeout: float) -> dict[str, Any]:
        child = self._child(label, role, dsn, *args)
        try:
            return self._result(child, timeout)
        finally:
            child.stop(grace=10)

    def database(self, label: str) -> str:
        dsn = self.run.fresh_database(f"{self.name}_{label}")
        self._once(label, "install", dsn, timeout=120)
        return dsn

    def enqueue(self, batch: int) -> tuple[float, str]:
        """The best of ``--repeat`` windows (as this project's loads), with each."""
        dsn = self.database(f"enqueue{batch}")
        tries = [self._enqueue_window(dsn, batch) for _ in range(self.run.opts.repeat)]
        figures = ", ".join(f"{t:,.0f}" for t in tries)
        return max(tries), f"best of {len(tries)} ({figures} jobs/s)"

    def _enqueue_window(self, dsn: str, batch: int) -> float:
        procs, conns = self.settings.enqueue1 if batch == 1 else self.settings.enqueue1000
        start_at = time.time() + STARTUP_S + self.run.opts.warmup
        seconds = self.run.opts.duration
        args = ["--batch", str(batch), "--conns", str(conns)]
        args += ["--start-at", f"{start_at:.3f}", "--seconds", f"{seconds:g}"]
        children = [self._child(f"enqueue{batch}-{i}", "enqueue", dsn, *args) for i in range(procs)]
        try:
            limit = STARTUP_S + self.run.opts.warmup + seconds + 60
            jobs = sum(int(self._result(c, limit)["jobs"]) for c in children)
        finally:
            for child in children:
                child.stop(grace=10)
        return jobs / seconds

    def fill(self, dsn: str, jobs: int, queue: str) -> None:
        args = ["--jobs", str(jobs), "--batch", "5000", "--conns", "4", "--queue", queue]
        self._once(f"fill-{queue}", "fill", dsn, *args, timeout=1800)

    def tune(self, quick: bool) -> str:
        """Try each worker shape on a short end to end; keep the fastest."""
        jobs = self.settings.tune_jobs // (4 if quick else 1)
        tried = []
        best = 0.0
        for shape in self.settings.work:
            self.shape = shape
            rate, _ = self.e2e(jobs, 0, label=f"tune{'x'.join(map(str, shape))}")
            tried.append(f"{'x'.join(map(str, shape))}: {rate:,.0f}/s")
            if rate > best:
                best, chosen = rate, shape
        self.shape = chosen
        return f"chose {'x'.join(map(str, chosen))} ({'; '.join(tried)})"

    def e2e(self, jobs: int, backlog: int, label: str = "") -> tuple[float, str]:
        dsn = self.database(label or f"e2e{backlog}")
        if backlog:
            self.fill(dsn, backlog, "other")
        self.fill(dsn, jobs, "default")
        asyncio.run(vacuum_analyze(dsn))
        procs, concurrency, batch = self.shape
        args = ["--drain", "--concurrency", str(concurrency), "--batch", str(batch)]
        workers = [self._child(f"work-{i}", "work", dsn, *args) for i in range(procs)]
        try:
            for worker in workers:
                worker.wait_line("READY", timeout=60)
            t0 = time.time()
            for worker in workers:
                os.kill(worker.pid, signal.SIGUSR1)
            finished: list[float] = []
            deadline = time.monotonic() + self.limit_s
            for worker in workers:
                left = max(1.0, deadline - time.monotonic())
                try:
                    finished.append(float(self._result(worker, left)["finished"]))
                except BenchError:
                    break
            stopped = len(finished) < len(workers)
            elapsed = (time.time() if stopped else max(finished)) - t0
        finally:
            for worker in workers:
                worker.stop(grace=10)
        remaining = asyncio.run(_count(dsn, REMAINING_SQL[self.name]))
        done = jobs - remaining
        note = f"{done:,} of {jobs:,} done in {elapsed:.1f} s, workers {procs} x {concurrency}"
        note += f" x {batch}"
        if stopped:
            note += f" (stopped at the {self.limit_s:.0f} s limit)"
        elif remaining:
            raise BenchError(f"{self.name}: workers ended with {remaining:,} jobs not done")
        return done / elapsed, note

    def latency(self, rate: float, seconds: float, warm_s: float) -> tuple[float, float]:
        dsn = self.database("latency")
        concurrency, batch = self.settings.latency
        samples = round(rate * seconds)
        warm = round(rate * warm_s)
        args = ["--concurrency", str(concurrency), "--batch", str(batch)]
        args += ["--samples", str(samples), "--warm", str(warm)]
        worker = self._child("latency-work", "work", dsn, *args)
        try:
            worker.wait_line("READY", timeout=60)
            os.kill(worker.pid, signal.SIGUSR1)
            paced = ["--rate", f"{rate:g}", "--seconds", f"{seconds + warm_s:g}"]
            self._once("latency-paced", "paced", dsn, *paced, timeout=seconds + warm_s + 60)
            values = [float(v) for v in self._result(worker, 60)["latencies_ms"]]
        finally:
            worker.stop(grace=10)
        return ours.percentiles(values)


async def _count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        value: int = await conn.fetchval(sql)
        return value
    finally:
        await conn.close()


def drivers(names: Sequence[str]) -> tuple[Path, dict[str, list[str]], dict[str, str]]:
    """The peers' python (it also draws the chart), the driver argv of each peer
    named, and the versions installed; the environments are made first if needed."""
    python = peer_venv.ensure()
    versions = peer_venv.versions(python)
    argv = {name: [str(python), str(peer_venv.DRIVER)] for name in names if name != NODE_PEER}
    if NODE_PEER in names:
        node = node_env.ensure()
        versions.update(node_env.versions(node))
        argv[NODE_PEER] = node.driver()
    return python, argv, versions


def main(run: Run, out: Path | None = None) -> int:
    sizes = Sizes.of(run.opts.quick)
    names = [name for name in PEERS if not run.opts.peer_names or name in run.opts.peer_names]
    try:
        python, argv, versions = drivers(names)
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"bench: the peers' environment could not be made: {exc}", flush=True)
        return 1
    print("bench: peers " + ", ".join(f"{n} {v}" for n, v in versions.items()), flush=True)
    for name in names:
        print(f"bench: {name}: {PEERS[name].describe()}", flush=True)
    peers = [PeerRunner(run, argv[name], name) for name in names]
    rows = measure(run, peers, sizes)
    print()
    print(render(rows))
    print()
    for row in rows:
        for note in row.notes:
            print(f"  {row.workload}: {note}")
    document = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions,
        "settings": {p.name: f"{p.settings.describe()} {p.tuned}" for p in peers},
        "this_project": (
            f"1 daemon (default settings, embedded-free: the bench's server), "
            f"HTTP {run.opts.conns} connections for 1-line adds, "
            f"{run.opts.bulk_conns} for 1000-line adds; no-op python handler"
        ),
        "sizes": asdict(sizes),
        "generator": run.generator,
    }
    path = write(rows, document, python, out or RESULTS)
    print(f"\nbench: wrote {path} and {path.with_suffix('.png').name}")
    failed = any(r.ours is None or any(v is None for v in r.peers.values()) for r in rows)
    return 1 if failed else 0

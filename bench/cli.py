"""``python -m bench``: durable adds and ingestion, each against a ceiling measured in the same run.

Sections (``--only`` picks some, comma-separated):

  fsync    (1) fdatasyncs/s of the disk under the temp dir
  copy     (2) COPY rows/s into PostgreSQL, batches of 1,000 / 5,000 / 10,000
  bare     (3) 1-line POSTs/s against bare aiohttp doing the same group-commit fsync
  add1     (4a) 1-line POSTs through the real daemon, jobs/s acknowledged; ratio vs (3)
  add1000  (4b) 1000-line POSTs through the real daemon, jobs/s; ratio vs the 100k/s target
  ingest   (5) journal → store rows/s with the daemon's Ingester; ratio vs (2)
  claim    claim + archive cost (ms per batch of 100) at 10k, 100k, 1M waiting; ratio 1M/10k
  keys     claim + archive cost (us a job) of types with concurrency keys; ratio to none
  coldstart  spawn → ready of a python and a node context (RunnerPool, in-process)
  latency  add → start of one job at a time on an idle daemon, p50/p99 (python handler)
  flood    the same for one tenant, idle and while another floods the daemon with a deep
           backlog of 20 ms CPU jobs and keeps adding more; ratio flooded / idle (<= 2);
           then the flood off and on in turns (10 rounds), the same ratio under one
           disk weather
  abuse    one tenant's add → start p50/p99 and the daemon's memory and descriptors,
           idle and while a hostile tenant attacks: big follow-on jobs, thousands of
           half-sent requests, slow 64 MiB bodies, self-multiplying follow-on jobs, a
           stderr flood; ratio to idle (p99 and memory <= 2x, no calm request failed)
  run1     end to end, ONE daemon: no-op python and node jobs/s, 100,000 jobs in
           1000-line POSTs after a warm-up, first POST → all done_ok; ratio vs 12k/s
  run3     the same with THREE daemons on one store, POSTs round-robin
  capacity CPU seconds per 1,000 jobs of the store (ingest; claim + archive; end to end)
           and of one daemon and its contexts, 100,000 no-op jobs; an idle daemon's cost
           (the figures docs/deploy.md sizes a deployment with)
  depth    end to end and the dashboard's reads with an empty store, 1,000,000 jobs
           waiting in another type, 100,000 waiting types across 1,000 tenants;
           ratio to the empty store (>= 0.9), reads against 20 ms

Everything it starts (PostgreSQL unless ``--store``, daemons, the bare server,
load generators, py-spy) is stopped before it exits, on error and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from bench import abuse, adds, capacity, depth, graph, keys, pulled, runs
from bench.http_load import Load, generator_name
from bench.pg import Databases, PrivatePostgres
from bench.procs import BenchError
from bench.profile import Profiler
from bench.report import Row, render

SECTIONS = (
    "fsync",
    "copy",
    "bare",
    "add1",
    "add1000",
    "ingest",
    "claim",
    "keys",
    "coldstart",
    "latency",
    "flood",
    "abuse",
    "run1",
    "run3",
    "pull",
    "graph",
    "capacity",
    "depth",
)


@dataclass
class Options:
    sections: list[str]
    store: str | None
    quick: bool
    warmup: float
    duration: float
    generator: str
    conns: int
    bulk_conns: int
    gen_procs: int
    ingest_rows: int
    ingest_workers: int
    copy_rows: int
    fsync_seconds: float
    repeat: int
    profile: Path | None
    tmp: Path | None
    keep: bool
    run_jobs: int = 100_000
    run_conns: int = 4
    latency_samples: int = 200
    flood_samples: int = 1000
    flood_backlog: int = 100_000
    abuse_samples: int = 200
    daemon_args: list[str] = field(default_factory=list)
    peers: bool = False
    peer_names: list[str] = field(default_factory=list)  # --peers: only these (default all)
    results: Path | None = None


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", action="append", default=[], help="sections, comma-separated")
    parser.add_argument("--store", default=None, help="PostgreSQL DSN (default: a private server)")
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke test (< 60 s)")
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per load")
    parser.add_argument("--warmup", type=float, default=None, help="seconds before measuring")
    parser.add_argument(
        "--generator", choices=("auto", "wrk", "python"), default="auto", help="load generator"
    )
    parser.add_argument("--conns", type=int, default=64, help="connections for 1-line POSTs")
    parser.add_argument("--bulk-conns", type=int, default=16, help="connections, 1000-line POSTs")
    parser.add_argument(
        "--gen-procs", type=int, default=1, help="generator processes (wrk: threads)"
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="loads per server, best kept (default 3, quick 1)"
    )
    parser.add_argument("--ingest-rows", type=int, default=None, help="rows per ingest run")
    parser.add_argument("--ingest-workers", type=int, default=None, help="default: the daemon's")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the daemon into DIR")
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the bench's temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, journals)")
    parser.add_argument(
        "--run-jobs", type=int, default=None, help="jobs per run1/run3 load (100,000; quick 10,000)"
    )
    parser.add_argument(
        "--run-conns", type=int, default=4, help="1000-line POSTs in flight in run1/run3"
    )
    parser.add_argument(
        "--latency-samples", type=int, default=None, help="jobs timed by latency (200; quick 50)"
    )
    parser.add_argument(
        "--flood-samples",
        type=int,
        default=None,
        help="calm jobs timed by flood, each phase (1000; quick 10)",
    )
    parser.add_argument(
        "--flood-backlog",
        type=int,
        default=None,
        help="flood jobs queued before measuring (100,000; quick 5,000)",
    )
    parser.add_argument(
        "--abuse-samples",
        type=int,
        default=None,
        help="calm jobs timed by abuse, each phase (200; quick 10)",
    )
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for the daemons of run1/run3/latency/flood, e.g. --daemon-arg=--lease=30",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="instead of the sections: this project beside pgqueuer, procrastinate and "
        "graphile-worker (bench/peers; installs them into environments of their own)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME",
        help="--peers: only this peer (repeatable; default: every peer)",
    )
    parser.add_argument(
        "--results", type=Path, default=None, help="--peers: where its JSON and PNG go"
    )
    args = parser.parse_args(argv)
    if args.peers and args.only:
        parser.error("--peers runs workloads of its own; it takes no --only")
    if args.peer:
        from bench.peers.run import PEERS

        if not args.peers:
            parser.error("--peer goes with --peers")
        unknown_peers = sorted(set(args.peer) - set(PEERS))
        if unknown_peers:
            parser.error(
                f"unknown peer(s) {', '.join(unknown_peers)}; choose from {', '.join(PEERS)}"
            )
    sections = [s.strip() for group in args.only for s in group.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    from queue_daemon.settings import Settings

    quick = args.quick
    return Options(
        sections=sections or list(SECTIONS),
        store=args.store or None,
        quick=quick,
        warmup=args.warmup if args.warmup is not None else (0.5 if quick else 1.0),
        duration=args.duration if args.duration is not None else (2.0 if quick else 5.0),
        generator=args.generator,
        conns=args.conns,
        bulk_conns=args.bulk_conns,
        gen_procs=args.gen_procs,
        ingest_rows=args.ingest_rows or (30_000 if quick else 300_000),
        ingest_workers=args.ingest_workers or Settings().ingest_workers,
        copy_rows=20_000 if quick else 200_000,
        fsync_seconds=0.5 if quick else 2.0,
        repeat=max(1, args.repeat or (1 if quick else 3)),
        profile=args.profile,
        tmp=args.tmp,
        keep=args.keep,
        run_jobs=args.run_jobs or (10_000 if quick else 100_000),
        run_conns=max(1, args.run_conns),
        latency_samples=args.latency_samples or (50 if quick else 200),
        flood_samples=args.flood_samples or (10 if quick else 1000),
        flood_backlog=args.flood_backlog or (5_000 if quick else 100_000),
        abuse_samples=args.abuse_samples or (10 if quick else 200),
        daemon_args=list(args.daemon_arg),
        peers=args.peers,
        peer_names=list(dict.fromkeys(args.peer)),
        results=args.results,
    )


@dataclass
class Run:
    """State shared by the sections of one bench run."""

    opts: Options
    work: Path
    generator: str
    rows: list[Row] = field(default_factory=list)
    fsync_rate: float | None = None
    copy_rates: dict[int, float] = field(default_factory=dict)
    copy_indexed: dict[int, float] = field(default_factory=dict)
    bare_rate: float | None = None
    profiles: list[tuple[str, str]] = field(default_factory=list)
    pg: PrivatePostgres | None = None
    databases: Databases | None = None
    daemon_dsn: str | None = None  # one database and tenant for every daemon section
    daemon_token: str | None = None
    add1_done: bool = False
    failed: bool = False  # a section recorded a failure without raising

    def admin_dsn(self) -> str:
        if self.databases is None:
            if self.opts.store is not None:
                dsn = self.opts.store
            else:
                print("  starting a private PostgreSQL ...", flush=True)
                self.pg = PrivatePostgres(self.work)
                dsn = self.pg.start()
            self.databases = Databases(dsn)
        return self.databases.admin_dsn

    def fresh_database(self, name: str) -> str:
        self.admin_dsn()
        assert self.databases is not None
        return asyncio.run(self.databases.fresh(name))

    def settle(self) -> None:
        """Before a measured phase: the server as quiet as before the last (bench.pg)."""
        if self.databases is not None:
            asyncio.run(self.databases.settle())
            if self.daemon_dsn != self.databases.admin_dsn:  # its database went with the others
                self.daemon_dsn = self.daemon_token = None

    def close(self) -> None:
        try:
            if self.databases is not None:
                asyncio.run(self.databases.drop_all())
        finally:
            if self.pg is not None:
                self.pg.stop()

    def profiler(self, name: str, *, subprocesses: bool = False) -> Profiler | None:
        if self.opts.profile is None:
            return None
        self.opts.profile.mkdir(parents=True, exist_ok=True)
        return Profiler(self.opts.profile, name, subprocesses=subprocesses)

    def load(self, url: str, body: bytes, headers: dict[str, str], conns: int) -> Load:
        return Load(
            url=url,
            body=body,
            headers={"Content-Type": "text/plain", **headers},
            conns=conns,
            warmup=self.opts.warmup,
            duration=self.opts.duration,
            procs=self.opts.gen_procs,
        )


SECTION_RUNNERS: dict[str, Callable[[Run], None]] = {
    "fsync": adds.section_fsync,
    "copy": adds.section_copy,
    "bare": adds.section_bare,
    "add1": adds.section_add1,
    "add1000": adds.section_add1000,
    "ingest": adds.section_ingest,
    "claim": runs.section_claim,
    "keys": keys.section_keys,
    "coldstart": runs.section_coldstart,
    "latency": runs.section_latency,
    "flood": runs.section_flood,
    "abuse": abuse.section_abuse,
    "run1": runs.section_run1,
    "run3": runs.section_run3,
    "pull": pulled.section_pull,
    "graph": graph.section_graph,
    "capacity": capacity.section_capacity,
    "depth": depth.section_depth,
}


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load}"


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    try:
        generator = generator_name(opts.generator)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="qd-bench-", dir=opts.tmp))
    work.chmod(0o711)  # handler processes run as another user below it (not listable)
    run = Run(opts=opts, work=work, generator=generator)
    print(f"bench: {_machine()}; temp dir {work}", flush=True)
    print(
        f"bench: load generator {generator}"
        + ("" if generator == "wrk" else " (install wrk for the best figures: apt-get install wrk)")
        + f"; {opts.warmup:g} s warm-up + {opts.duration:g} s measured per load",
        flush=True,
    )
    failed = False
    started = time.monotonic()
    try:
        if opts.peers:
            from bench.peers import run as peers

            failed = peers.main(run, opts.results) != 0
        for name in SECTIONS if not opts.peers else ():
            if name not in opts.sections:
                continue
            if name == "add1" and run.add1_done:
                continue
            both = name == "bare" and "add1" in opts.sections
            print(f"bench: {'bare + add1, alternating' if both else name} ...", flush=True)
            t0 = time.monotonic()
            try:
                SECTION_RUNNERS[name](run)
            except BenchError as exc:
                failed = True
                print(f"bench: {name} failed: {exc}", file=sys.stderr, flush=True)
                run.rows.append(Row(f"{name}", None, "", notes=str(exc).splitlines()[0]))
            print(f"bench: {name} done in {time.monotonic() - t0:.1f} s", flush=True)
    except KeyboardInterrupt:
        print("bench: interrupted; stopping what it started", file=sys.stderr, flush=True)
        failed = True
    finally:
        run.close()
        if opts.keep:
            print(f"bench: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if run.rows:
        print()
        print(render(run.rows))
    print()
    print(f"bench: {_machine()} at the end; {time.monotonic() - started:.0f} s in all")
    for name, summary in run.profiles:
        print(f"\nprofile of the server under '{name}' (py-spy, {opts.profile}/{name}.txt):")
        print(summary)
    return 1 if failed or run.failed else 0

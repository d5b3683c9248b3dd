"""The real daemon, started the way an operator starts it, and its bench tenant."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.pg import count_jobs
from bench.procs import BenchError, Child, python

TENANT = "bench"
JOBTYPE = "bench_add"
READY_TIMEOUT = 90.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_DAEMON_")}
    env["QUEUE_DAEMON_LOG_LEVEL"] = "WARNING"
    return env


def _store(dsn: str | None) -> list[str]:
    """``--store DSN``; none for the embedded server in the data dir (the default)."""
    return [] if dsn is None else ["--store", dsn]


def add_tenant(dsn: str | None, data_dir: Path, client: str = TENANT) -> str:
    """Create a tenant (the bench's by default) and return its token (the last line of stdout)."""
    argv = python("-m", "queue_daemon", "tenant", "add", client, *_store(dsn))
    argv += ["--data-dir", str(data_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        raise BenchError(f"tenant add failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def tenant_limits(dsn: str | None, data_dir: Path, client: str, limits: Sequence[str]) -> None:
    """``queue-daemon tenant limits CLIENT KEY=VALUE…`` (before the daemon starts)."""
    argv = python("-m", "queue_daemon", "tenant", "limits", client, *limits, *_store(dsn))
    argv += ["--data-dir", str(data_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=120)
    if done.returncode != 0:
        raise BenchError(f"tenant limits failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def start_daemon(
    name: str, dsn: str | None, data_dir: Path, log_dir: Path, extra: Sequence[str] = ()
) -> tuple[Child, str]:
    """A ``queue-daemon serve --port 0`` subprocess and its base URL; ``extra``: more flags.

    The per-tenant add rate and waiting limits are off: the bench measures what the
    daemon can take, and one bench tenant adds millions of jobs in seconds (the
    defaults, 100,000 jobs/s and 1,000,000 waiting, would answer 429)."""
    argv = python("-m", "queue_daemon", "serve", "--port", "0", *_store(dsn))
    argv += ["--data-dir", str(data_dir), "--drain-timeout", "5"]
    argv += ["--tenant-rate", "0", "--tenant-waiting", "0", *extra]
    daemon = Child(name, argv, log_dir=log_dir, env=_env())
    try:
        line = daemon.wait_line("listening on ", timeout=READY_TIMEOUT)
    except BaseException:
        daemon.stop(grace=5)
        raise
    return daemon, line.split("listening on ", 1)[1].strip()


def ingest_lag(url: str) -> int | None:
    """Journal lines not yet in the store, from ``/healthz``; None if it cannot say."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as reply:
            body = json.loads(reply.read())
    except (OSError, ValueError):
        return None
    lines = body.get("ingest_lag", {}).get("lines")
    return lines if isinstance(lines, int) else None


def drain_report(url: str, dsn: str, within: float) -> str:
    """How far ingestion lags once the load stops, and how long it takes to catch up.

    From ``/healthz``'s ``ingest_lag``; if that cannot say, from the store: the
    rows of the bench's jobtype, until their count stops growing.
    """
    start = time.monotonic()
    lag = first = ingest_lag(url)
    if lag is not None:
        while lag and time.monotonic() - start < within:
            time.sleep(0.05)
            lag = ingest_lag(url)
        waited = time.monotonic() - start
        if lag == 0:
            return f"ingest lag {first:,} lines when the load stopped, 0 after {waited:.1f} s"
        return f"ingest lag {first} lines when the load stopped, {lag} after {waited:.1f} s"
    jobtype = f"{TENANT}-{JOBTYPE}"
    first_count = count = asyncio.run(count_jobs(dsn, jobtype))
    steady_since = time.monotonic()
    while time.monotonic() - start < within and time.monotonic() - steady_since < 1.0:
        time.sleep(0.1)
        now = asyncio.run(count_jobs(dsn, jobtype))
        if now != count:
            count, steady_since = now, time.monotonic()
    waited = steady_since - start
    return (
        f"/healthz gave no ingest lag; the store held {first_count:,} rows when the load "
        f"stopped, {count:,} ({count - first_count:,} more) {waited:.1f} s later"
    )

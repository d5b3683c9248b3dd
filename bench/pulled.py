"""The ``pull`` section: jobs of a pulled type, run by the tenant's own worker
processes over HTTP (docs/workers.md): throughput end to end, and how soon a
held claim on one daemon sees a job added on another."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bench import daemon
from bench.e2e import Latency
from bench.report import Row
from bench.runs import daemons
from bench.wakeup import measure_wakeup

if TYPE_CHECKING:
    from bench.cli import Run

WAKE_TARGET_MS = 20.0  # p50, add on one daemon → held claim on another answered
PULL_TARGET = 10_000.0  # no-op pulled jobs/s end to end, 4 worker processes


def section_pull(run: Run) -> None:
    samples = run.opts.latency_samples
    with daemons(run, "pull_wake", 2) as (_, urls, token):
        woke = asyncio.run(measure_wakeup(urls[0], urls[1], token, daemon.TENANT, samples=samples))
    p50, p99 = Latency.pct(woke, 0.5), Latency.pct(woke, 0.99)
    notes = f"{samples} jobs one at a time, claim held on one daemon, add on another"
    run.rows.append(
        Row(
            "(pull) held claim wake-up, p50",
            p50,
            "ms",
            "target <= 20 ms",
            p50 / WAKE_TARGET_MS,
            notes,
        )
    )
    run.rows.append(
        Row(
            "(pull) held claim wake-up, p99",
            p99,
            "ms",
            "",
            None,
            f"min {min(woke):.1f} ms, max {max(woke):.1f} ms",
        )
    )

"""The benchmark still runs end to end (figures are printed, not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(330)
def test_bench_quick_runs_every_section() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=320,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for figure in (
        "(1) fdatasync",
        "(2) COPY",
        "(3) bare aiohttp",
        "(4a) daemon, 1-line",
        "(4b) daemon, 1000-line",
        "(5) ingest",
        "(claim) claim+archive",
        "(coldstart) python context",
        "(coldstart) node context",
        "(latency) add → start, p50",
        "(flood) CPU flood: calm add → start p50",
        "(flood) CPU flood on / off in turns, worst of p50, p99",
        "(abuse) idle: calm add → start p99",
        "(abuse) stats (10): daemon resident memory",
        "(run1) 1 daemon, python no-op",
        "(run1) 1 daemon, node no-op",
        "(run3) 3 daemons, python no-op",
        "(run3) 3 daemons, node no-op",
        "(capacity) store, claim + archive",
        "(capacity) daemon + contexts, end to end",
    ):
        assert figure in done.stdout
    assert "FAILED" not in done.stdout

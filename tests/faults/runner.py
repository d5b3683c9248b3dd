"""Run ``python -m bench.faults`` as an operator does, and stop it cleanly on a
timeout: SIGINT first, so that its servers (PostgreSQL, a primary and a
standby) and daemons are stopped by its own clean-up, then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_campaign(args: list[str], timeout: float) -> tuple[int, str]:
    """The campaign's exit status and what it printed (stdout, then stderr's end)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_DAEMON_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.faults", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        err += f"\n(stopped after {timeout:.0f} s)"
    return process.returncode, f"{out}\n--- stderr ---\n{err[-4000:]}"

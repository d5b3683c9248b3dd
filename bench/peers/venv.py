"""The peers' own virtual environment: pgqueuer, procrastinate and matplotlib at the
versions pinned in ``requirements.txt``, kept apart from the project's.

It lives in the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``), named after
the hash of the pins, so a second run reuses it and a change of pins makes a
new one. The node peer's packages sit beside it (``node_env``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from bench.procs import BenchError

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
DRIVER = HERE / "driver.py"
CHART = HERE / "chart.py"
INSTALL_TIMEOUT = 900.0


def pins() -> list[str]:
    lines = REQUIREMENTS.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def cache() -> Path:
    """Where the peers' environments live: the user's cache, ``queue-daemon/`` in it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "queue-daemon"


def location() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return cache() / f"bench-peers-{digest}"


def ensure() -> Path:
    """The venv's python, created and installed first if needed (PyPI)."""
    root = location()
    python = root / "bin" / "python"
    ready = root / ".installed"
    if ready.exists() and python.exists():
        return python
    print(f"  creating the peers' virtual environment in {root} ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(root)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
            str(REQUIREMENTS),
        ],
    ]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        if done.returncode != 0:
            raise BenchError(f"{' '.join(argv[:4])} failed: {done.stderr.strip()[-2000:]}")
    ready.write_text("\n".join(pins()) + "\n")
    return python


def versions(python: Path) -> dict[str, str]:
    """name → installed version of each pinned package."""
    names = [pin.split("==")[0].split("[")[0] for pin in pins()]
    code = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))\n"
    )
    done = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise BenchError(f"reading the peers' versions failed: {done.stderr.strip()[-1000:]}")
    import json

    found: dict[str, str] = json.loads(done.stdout)
    return found

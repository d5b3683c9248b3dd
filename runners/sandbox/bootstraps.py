"""The language bootstraps (``runners/bootstrap``), copied where handlers can read them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# installed as package data of queue_daemon.runners (pyproject.toml)
BOOTSTRAP_SOURCE = Path(__file__).resolve().parents[1] / "bootstrap"


def copy_bootstraps(target: Path) -> None:
    """Bootstraps live where the run-as user can read them, whatever the install path."""
    target.mkdir(mode=0o755, exist_ok=True)
    os.chmod(target, 0o755)
    for source in BOOTSTRAP_SOURCE.iterdir():
        if not source.is_file() or source.suffix not in (".py", ".js"):
            continue
        data = source.read_bytes()
        dest = target / source.name
        if dest.is_file() and dest.read_bytes() == data:
            continue
        fd, tmp = tempfile.mkstemp(dir=target, prefix=".tmp-")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)

"""Processes and cgroups seen from /proc and /sys/fs/cgroup (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from bench.procs import proc_stats
from queue_daemon.runners.sandbox import cgroups


def children(pid: int) -> list[int]:
    """Live (not zombie) direct children of ``pid``."""
    return sorted(p for p, fields in proc_stats() if int(fields[1]) == pid and fields[0] != "Z")


def cgroup_table() -> dict[int, str]:
    """pid -> cgroup v2 path of every live process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    table[int(entry.name)] = line[3:]
        except OSError:
            continue
    return table


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still exist and are not zombies."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def own_cgroup_dir() -> Path | None:
    """The directory of this process's cgroup, where daemons it starts make theirs
    (found as the daemon finds its own: ``queue_daemon.runners.sandbox.cgroups``)."""
    mount, own = cgroups._mount_point(), cgroups._own_path()
    if mount is None or own is None:
        return None
    path = mount / own.lstrip("/")
    return path if path.is_dir() else None


def cgroup_names() -> list[str]:
    """Names of the cgroups beside this process's (the daemons' ``queue-daemon-*``)."""
    where = own_cgroup_dir()
    if where is None:
        return []
    with contextlib.suppress(OSError):
        return [p.name for p in where.iterdir() if p.is_dir()]
    return []


def send(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)

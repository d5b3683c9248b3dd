"""All of a daemon's handlers weigh as one process on the CPU, shared fairly by tenants.

Without it, every handler context is a CPU scheduling entity as heavy as the
daemon itself (each starts its own session, so the kernel's autogroups put
each in a group of its own): a tenant whose jobs keep eight cores' worth of
contexts busy leaves the daemon a ninth of the machine, and every other
tenant's add, ingestion and claim waits for it. In one CPU cgroup of the
weight of a single process (``cpu.shares`` 1024, as the daemon's own group)
the handlers of a daemon, however many, get as much CPU as the daemon when
both want it, and all of it when the daemon does not. (A lower weight starves
the contexts whenever daemons and PostgreSQL keep the cores busy: three
daemons on two cores ran half as many jobs at 64.) Processes
cannot leave the group (its ``cgroup.procs`` is root's), ``setsid()`` or not.
Inside it each tenant (each handler uid) has a group of its own of equal
weight, so a tenant's fifty busy contexts share one tenant's part of the CPU
and another tenant's single job still gets the other part at once.

The group is ``<the daemon's cpu cgroup>/queue-handlers-<pid>.<k>/u-<uid>`` on the
cgroup v1 ``cpu`` controller; a handler process enters it in the same root
wrapper that enters its cgroup v2 (see ``runners.sandbox``). Groups of daemons
that died are removed by the next daemon. Only as root and where the ``cpu``
controller is mounted as cgroup v1 (as on hybrid hierarchies); under a pure
cgroup v2 hierarchy the daemon's cgroup holds the daemon itself, which v2
forbids to hand controllers down from, and handlers keep the kernel's default
weight (the README says so). Blocking: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from pathlib import Path

from runners.cgroups import pid_alive

logger = logging.getLogger(__name__)

PREFIX = "queue-handlers-"
HANDLER_SHARES = 1024  # cpu.shares of all handlers together: as much as the daemon alone
_groups = itertools.count(1)


def _v1_cpu_dir() -> Path | None:
    """The daemon's own cgroup directory on the v1 ``cpu`` controller, or None."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    mount = None
    for line in mounts:
        fields = line.split(" - ", 1)
        if len(fields) != 2:
            continue
        fstype, _source, options = [*fields[1].split(), "", "", ""][:3]
        if fstype == "cgroup" and "cpu" in options.split(","):
            mount = Path(fields[0].split()[4])
            break
    if mount is None:
        return None
    for line in own:
        _number, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return mount / path.lstrip("/")
    return None


class CpuGroup:
    """The low-weight CPU cgroup this daemon's handler processes run in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tenants: set[str] = set()

    def procs(self, uid: int) -> Path:
        """The ``cgroup.procs`` of the group of the handlers running as ``uid`` (made
        at its first use: a mkdir on the cgroup file system, no disk I/O)."""
        name = f"u-{uid}"
        path = self.path / name
        if name not in self._tenants:
            path.mkdir(exist_ok=True)
            self._tenants.add(name)
        return path / "cgroup.procs"

    @classmethod
    def find(cls) -> CpuGroup | None:
        """Made now, or None where it cannot be (not root, no v1 cpu controller)."""
        if os.geteuid() != 0:
            return None
        parent = _v1_cpu_dir()
        if parent is None or not (parent / "cpu.shares").exists():
            return None
        sweep(parent)
        path = parent / f"{PREFIX}{os.getpid()}.{next(_groups)}"
        try:
            path.mkdir(exist_ok=True)
            (path / "cpu.shares").write_text(str(HANDLER_SHARES))
        except OSError as exc:
            logger.info(
                "handlers keep the default CPU weight (%s)", exc, extra={"action": "sandbox_cpu"}
            )
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def close(self) -> None:
        """Remove the group; its processes were killed with their cgroups or contexts."""
        remove(self.path)


def remove(path: Path) -> None:
    """Remove ``path`` and its groups; a process still in one moves to ``path``'s parent."""
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir():
                remove(child)
    with contextlib.suppress(OSError):
        parent_procs = path.parent / "cgroup.procs"
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                parent_procs.write_text(pid)
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.info("cannot remove CPU group %s: %s", path, exc, extra={"action": "sandbox_cpu"})


def sweep(parent: Path) -> None:
    """Remove the groups of daemons that are gone."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            number = entry.name.removeprefix(PREFIX).split(".")[0]
            ours = entry.name.startswith(PREFIX) and number.isdigit() and entry.is_dir()
            if ours and int(number) != os.getpid() and not pid_alive(int(number)):
                remove(entry)

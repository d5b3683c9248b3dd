"""Per-process-tree cgroups (cgroup v2): what a handler starts cannot outlive its kill.

A process group does not hold a handler's tree: a child that calls
``setsid()`` (or double-forks into the background) leaves it and survives
``killpg``. A cgroup does hold it: a process cannot move itself out of one
without write access to another cgroup's ``cgroup.procs`` (root's files), and
writing ``1`` to ``cgroup.kill`` (Linux 5.14+) SIGKILLs every process in it,
including those forked meanwhile.

Layout: ``<the daemon's own cgroup>/queue-daemon-<pid>.<k>/run-<n>``, one
``run-<n>`` per context or shell job (``k`` numbers the runner pools of one
process). The process enters its cgroup before it runs any
handler code: the first wrapper, run as root, writes its own pid into
``cgroup.procs`` and then execs the rest (see ``queue_daemon.runners.sandbox``). Cgroups
of daemons that died (``queue-daemon-<pid>.<k>`` whose pid no longer exists) are
killed and removed when the next daemon prepares its sandbox.

Only when the daemon is root and a cgroup v2 hierarchy with ``cgroup.kill`` is
mounted; elsewhere ``find`` returns None and the process group is all there is.
Blocking throughout: call it through ``asyncio.to_thread`` from the event loop.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "queue-daemon-"
EMPTY_WAIT = 5.0  # seconds a killed cgroup gets to empty before it is left for later
_trees = itertools.count(1)


def _mount_point() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` or, hybrid, ``…/unified``)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[:1] == ["cgroup2"]:
            return Path(fields[0].split()[4])
    return None


def _own_path() -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of /proc/self/cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CgroupTree:
    """This daemon's cgroup; hands out one child cgroup per handler process tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._numbers = itertools.count(1)

    @classmethod
    def find(cls) -> CgroupTree | None:
        """This daemon's cgroup, made now, or None when cgroups cannot be used here."""
        if os.geteuid() != 0:
            return None
        mount, own = _mount_point(), _own_path()
        if mount is None or own is None:
            return None
        parent = mount / own.lstrip("/")
        if not (parent / "cgroup.kill").exists() and parent != mount:
            return None  # a kernel before 5.14: no cgroup.kill
        sweep(parent)
        root = parent / f"{PREFIX}{os.getpid()}.{next(_trees)}"
        if root.exists():  # left by an earlier process that had our pid
            remove_tree(root)
        try:
            root.mkdir()
        except OSError as exc:
            logger.warning(
                "cannot make a cgroup for handlers (%s)", exc, extra={"action": "sandbox_cgroup"}
            )
            return None
        if not (root / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                root.rmdir()
            return None
        return cls(root)

    def new(self) -> Path:
        """A new, empty cgroup for one process tree."""
        path = self.root / f"run-{next(self._numbers)}"
        path.mkdir()
        return path

    @staticmethod
    def kill(path: Path) -> None:
        """SIGKILL every process in ``path`` (quick: the kernel does the rest)."""
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")

    @staticmethod
    def remove(path: Path) -> bool:
        """Kill what is left in ``path``, wait until it is empty and remove it."""
        return remove_tree(path)

    def close(self) -> None:
        """Remove this daemon's cgroup (killing whatever is still in it)."""
        remove_tree(self.root)


def remove_tree(path: Path) -> bool:
    """Kill every process below ``path`` and remove its cgroups, children first."""
    CgroupTree.kill(path)
    deadline = time.monotonic() + EMPTY_WAIT
    while _populated(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        for child in sorted(path.iterdir(), reverse=True):
            if child.is_dir():
                remove_tree(child)
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.warning("cannot remove cgroup %s: %s", path, exc, extra={"action": "sandbox_cgroup"})
        return False
    return True


def _populated(path: Path) -> bool:
    try:
        text = (path / "cgroup.events").read_text()
    except OSError:
        return False
    return "populated 1" in text


def sweep(parent: Path) -> None:
    """Kill and remove the cgroups of daemons that are gone (their handlers may live on)."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            number = entry.name.removeprefix(PREFIX).split(".")[0]
            if not (entry.name.startswith(PREFIX) and number.isdigit() and entry.is_dir()):
                continue
            if int(number) != os.getpid() and not pid_alive(int(number)):
                logger.info(
                    "removing the handler cgroup of a daemon that is gone: %s",
                    entry,
                    extra={"action": "sandbox_cgroup_swept"},
                )
                remove_tree(entry)

"""A daemon's handlers weigh as much as the daemon itself on the CPU, whatever their number.

Without it, every handler context is a CPU scheduling entity as heavy as the
daemon itself (each starts its own session, so the kernel's autogroups put
each in a group of its own): a tenant whose jobs keep eight cores' worth of
contexts busy leaves the daemon a ninth of the machine, and every other
tenant's add, ingestion and claim waits for it.

So the daemon moves itself into a CPU cgroup of its own,
``<its cpu cgroup>/queue-daemon-<pid>`` (``cpu.shares`` 2048: the weight of two
processes, the daemon's and its handlers' as before), as ``…/daemon``, and
its handlers run beside it in ``…/handlers-<k>``, of the daemon's weight
(``cpu.shares`` 1024). The handlers' group is not idle-class: the kernel
shares a group's weight out among the cores by the load the group has on
each, so a core where only an idle-class member of the daemon's group waits
got almost none of it, and that handler waited for every other process on
its core (PostgreSQL's backends, the client, any other work on the machine)
to sleep (the measured cost: docs/security.md, the row on the cores). Where the
kernel has ``cpu.idle``, the daemon's own wake-ups are not queued behind a
busy tenant's handlers (below), and a tenant's handlers within its share
weigh as one process against the daemon. A daemon that starts the embedded
PostgreSQL takes its place before it starts the server (``DaemonPlace``), so
the server's processes start there too: the store's every commit and claim
is on each job's way from add to start.

Inside the handlers' group each tenant (each handler uid) has a group of its
own of equal weight, so a tenant's fifty busy contexts share one tenant's
part of the CPU and another tenant's single job still gets the other part at
once. Processes cannot leave these groups (their ``cgroup.procs`` are
root's), ``setsid()`` or not. The daemon marks the groups of busy tenants
(``mark_busy``: those running more contexts at once than their share of the
cores, see ``queue_daemon.scheduler.busy_tenants``) ``cpu.idle``: a handler of
another tenant that wakes then takes the core from a busy tenant's handler
at once, instead of waiting for the kernel to end that handler's time slice
(up to a few scheduler ticks). Busy tenants share equally among themselves;
the others run at most their share of the cores between them, so the mark
cannot starve a busy tenant below its share.

Idle-class inside the daemon's group, a busy tenant's handlers still came
before every process outside it, the kernel's own threads included: under a
CPU flood the block layer's I/O completion worker waited for a core behind
them, and every fdatasync of the journal and the WAL took several times
longer. So a busy tenant's processes also move to
``<its cpu cgroup>/queue-daemon-<pid>.busy/handlers-<k>/u-<uid>``, a group
idle-class beside every other (``mark_busy``; they move back when the mark
goes, and a tenant's contexts that start while it is busy start there).
There they run on CPU time no other process on the machine wants, and the
daemon's wake-ups take a core from them at once. Unlike all handlers idle
machine-wide, this costs only tenants over their share while another tenant
runs within its share (``queue_daemon.scheduler.busy_tenants``).

A handler process enters its group in the same root wrapper that enters its
cgroup v2 (see ``queue_daemon.runners.sandbox``). The daemon moves back, and its group is
removed, when its last handlers' group closes; groups of daemons that died are
removed by the next daemon (their processes move up to the parent). Only as
root and where the ``cpu`` controller is mounted as cgroup v1 (as on hybrid
hierarchies); under a pure cgroup v2 hierarchy the daemon's cgroup holds the
daemon itself, which v2 forbids to hand controllers down from, and handlers
keep the kernel's default weight (docs/security.md says so). Where the kernel has
no ``cpu.idle`` (before Linux 5.15) busy tenants are neither marked nor
moved; with ``--realtime`` the daemon is still raised while they are busy.

The daemon's own group, its place at start-up and its real-time hold are in
``queue_daemon.runners.sandbox.cpuplace``. Blocking: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Set
from pathlib import Path

from queue_daemon.runners.sandbox.cpuplace import (
    HANDLER_SHARES,
    HOME_LOCK,
    Home,
    drop_home,
    home_now,
    remove,
    unuse,
)

logger = logging.getLogger(__name__)

_groups = itertools.count(1)


class CpuGroup:
    """The CPU cgroup this daemon's handler processes run in, below the daemon's own."""

    def __init__(self, path: Path, home: Home | None = None) -> None:
        self.path = path
        self._home = home
        self._tenants: set[str] = set()
        self._busy: set[str] = set()  # groups to mark idle-class
        self._marked: set[str] = set()  # groups marked
        self._lock = threading.Lock()  # procs runs on the event loop, mark_busy in a thread
        self._moving = threading.Lock()  # one mark_busy's moves at a time
        self.realtime = True  # False: busy marks leave the daemon's place normal

    def procs(self, uid: int) -> Path:
        """The ``cgroup.procs`` of the group of the handlers running as ``uid`` (made
        at its first use: a mkdir on the cgroup file system, no disk I/O): in the busy
        tenants' group while ``uid`` is marked busy there."""
        name = f"u-{uid}"
        path = self.path / name
        with self._lock:
            if name not in self._tenants:
                path.mkdir(exist_ok=True)
                self._tenants.add(name)
                if name in self._busy:
                    self._mark(name, True)
            away = name in self._busy  # its processes are in the busy group
        busy = self._busy_dir() if away else None
        if busy is not None:
            (busy / name).mkdir(parents=True, exist_ok=True)
            return busy / name / "cgroup.procs"
        return path / "cgroup.procs"

    def mark_busy(self, uids: Set[int]) -> None:
        """Mark the groups of the handlers running as ``uids`` idle-class among the
        tenants' groups, and the others not (a group made later gets its mark when
        made); and move those tenants' processes into the busy tenants' group, which
        is idle-class beside every other process, and the others' back. While any
        tenant is busy the daemon's place runs real-time (``Home.realtime``); call
        again with the same ``uids`` to raise tasks it started since."""
        with self._moving:
            with self._lock:
                away = self._busy & self._tenants
                self._busy = {f"u-{uid}" for uid in uids}
                for name in sorted(self._tenants):
                    busy = name in self._busy
                    if busy != (name in self._marked):
                        self._mark(name, busy)
                leaving, coming = away - self._busy, (self._busy & self._tenants) - away
            if self._home is not None:
                self._home.realtime(self, bool(self._busy) and self.realtime)
            busy_dir = self._busy_dir() if coming or leaving else None
            if busy_dir is None:
                return
            for name in sorted(leaving):
                _move_procs(busy_dir / name, self.path / name)
            for name in sorted(coming):
                _move_procs(self.path / name, busy_dir / name)

    def _busy_dir(self) -> Path | None:
        """This group's place in the busy tenants' group (``<…>.busy/handlers-<k>``)."""
        if self._home is None:
            return None
        root = self._home.busy()
        return None if root is None else root / self.path.name

    def _mark(self, name: str, busy: bool) -> None:
        try:
            (self.path / name / "cpu.idle").write_text("1" if busy else "0")
        except FileNotFoundError:
            return  # no cpu.idle (before Linux 5.15): tenants keep equal weights
        except OSError as exc:
            logger.info(
                "cannot mark the CPU group %s: %s", name, exc, extra={"action": "sandbox_cpu"}
            )
            return
        if busy:
            self._marked.add(name)
        else:
            self._marked.discard(name)

    @classmethod
    def find(cls) -> CpuGroup | None:
        """Made now, or None where it cannot be (not root, no v1 cpu controller)."""
        if os.geteuid() != 0:
            return None
        with HOME_LOCK:
            return cls._find()

    @classmethod
    def _find(cls) -> CpuGroup | None:
        home: Home | None = None
        path: Path | None = None
        try:
            home = home_now()
            if home is None:
                return None
            path = home.path / f"handlers-{next(_groups)}"
            path.mkdir(exist_ok=True)
            (path / "cpu.shares").write_text(str(HANDLER_SHARES))
        except OSError as exc:
            logger.info(
                "handlers keep the default CPU weight (%s)", exc, extra={"action": "sandbox_cpu"}
            )
            if path is not None:
                remove(path)
            if home is not None and home.users == 0:
                drop_home(home)
            return None
        home.users += 1
        return cls(path, home)

    def close(self) -> None:
        """Remove the group (its processes were killed with their cgroups or contexts);
        with the last, the daemon goes back to where it was and its group goes too."""
        if self._home is not None:
            self._home.realtime(self, None)
        remove(self.path)
        busy = self._home.made_busy() if self._home is not None else None
        if busy is not None:
            remove(busy / self.path.name)
        unuse(self.path.parent)


def _move_procs(source: Path, target: Path) -> None:
    """Move every process of the group ``source`` into the group ``target`` (made if
    need be); one that ended meanwhile is skipped. Each move may wait for the
    kernel's RCU grace period (milliseconds): call from a thread."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        pids = (source / "cgroup.procs").read_text().split()
    except OSError as exc:
        logger.info("cannot move CPU group %s: %s", source, exc, extra={"action": "sandbox_cpu"})
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            (target / "cgroup.procs").write_text(pid)

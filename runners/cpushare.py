"""A daemon comes first on the CPU before its handlers; together they weigh as two processes.

Without it, every handler context is a CPU scheduling entity as heavy as the
daemon itself (each starts its own session, so the kernel's autogroups put
each in a group of its own): a tenant whose jobs keep eight cores' worth of
contexts busy leaves the daemon a ninth of the machine, and every other
tenant's add, ingestion and claim waits for it.

So the daemon moves itself into a CPU cgroup of its own,
``<its cpu cgroup>/queue-daemon-<pid>`` (``cpu.shares`` 2048: the weight of two
processes, the daemon's and its handlers' as before), as ``…/daemon``, and
its handlers run beside it in ``…/handlers-<k>``, marked ``cpu.idle``: within
the daemon's group they get whatever CPU the daemon does not use, and a
daemon thread that wakes up takes the core from a handler at once instead of
queueing behind it for the rest of its time slice. A job's way from add to
start wakes the daemon several times (the POST, the journal's fsync thread,
the ingest and claim replies), so under a flood of CPU-bound handlers that
queueing, about a millisecond a wake-up, had doubled another tenant's add →
start latency. A ``cpu.shares`` weight does not buy that (the daemon at 4x
the handlers' weight measured the same): weights share out CPU time, and only
an idle group is preempted on every wake-up. The idle mark is relative to the
daemon alone: against PostgreSQL, other daemons and every other process the
daemon's group competes with its full weight, which its handlers get whole
while the daemon waits (marking the handlers idle machine-wide starved them
behind three daemons and PostgreSQL: half the jobs/s, and node contexts
timed out). A daemon that starts the embedded PostgreSQL takes its place
before it starts the server (``DaemonPlace``), so the server's processes start
there too and come before handlers as the daemon does: the store's every
commit and claim is on each job's way from add to start.

Inside the handlers' group each tenant (each handler uid) has a group of its
own of equal weight, so a tenant's fifty busy contexts share one tenant's
part of the CPU and another tenant's single job still gets the other part at
once. Processes cannot leave these groups (their ``cgroup.procs`` are
root's), ``setsid()`` or not. The daemon marks the groups of busy tenants
(``mark_busy``: those running more contexts at once than their share of the
cores, see ``scheduler.busy_tenants``) ``cpu.idle`` as well: a handler of
another tenant that wakes then takes the core from a busy tenant's handler
at once, as the daemon does, instead of waiting for the kernel to end that
handler's time slice (up to a few scheduler ticks). Busy tenants share
equally among themselves; the others run at most their share of the cores
between them, so the mark cannot starve a busy tenant below its share.

Idle-class inside the daemon's group, a busy tenant's handlers still came
before every process outside it, the kernel's own threads included: under a
CPU flood the block layer's I/O completion worker waited for a core behind
them, and every fdatasync of the journal and the WAL took several times
longer. So a busy tenant's processes also move to
``<its cpu cgroup>/queue-daemon-<pid>.busy/handlers-<k>/u-<uid>``, a group
idle-class beside every other (``mark_busy``; they move back when the mark
goes, and a tenant's contexts that start while it is busy start there).
There they run on CPU time no other process on the machine wants. Unlike all
handlers idle machine-wide (above), this costs only tenants over their share
while another tenant runs within its share (``scheduler.busy_tenants``).

A handler process enters its group in the same root wrapper that enters its
cgroup v2 (see ``runners.sandbox``). The daemon moves back, and its group is
removed, when its last handlers' group closes; groups of daemons that died are
removed by the next daemon (their processes move up to the parent). Only as
root and where the ``cpu`` controller is mounted as cgroup v1 (as on hybrid
hierarchies); under a pure cgroup v2 hierarchy the daemon's cgroup holds the
daemon itself, which v2 forbids to hand controllers down from, and handlers
keep the kernel's default weight (the README says so). Where the kernel has
no ``cpu.idle`` (before Linux 5.15) the handlers' group gets the daemon's
weight instead.

Idle-class, a busy tenant's handlers still fill every core, and then the
kernel's wake-up placement works against everyone else: it looks for an idle
core only while the cores' summed load is low, and counts idle-class work as
load, so a woken PostgreSQL backend, daemon thread or handler stays on the core
it last ran on, queued behind whatever normal process runs there (the daemon
or a backend), while the other cores run only idle-class work it would have
taken at once. That doubled another tenant's add → start p99 under a CPU
flood. So while any tenant is marked busy (``realtime``), the daemon's place
(its threads and the PostgreSQL server it started) runs at the lowest
real-time priority (``SCHED_RR`` 1): a real-time task that wakes takes a core
that runs no real-time task at once, whichever it last ran on. With
``SCHED_RESET_ON_FORK``, so every process and thread started from it (every
handler context) starts as a normal process; tasks started meanwhile (a new
backend) are raised at the next check. The kernel's real-time throttling
(``kernel.sched_rt_runtime_us``, by default 95% of each core) still leaves the
rest of the machine its share; where it is off (-1) the daemon does not use
real-time priority. Where the kernel groups real-time time by cgroup
(``cpu.rt_runtime_us``), the daemon's group gets its parent's budget while
real-time, and none after; where it cannot (another group holds it), the
daemon stays a normal process and logs why. With no tenant busy (one tenant,
or all within their share) nothing changes. Blocking: call through
``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Set
from pathlib import Path

from runners.cgroups import pid_alive

logger = logging.getLogger(__name__)

PREFIX = "queue-daemon-"
OLD_PREFIX = "queue-handlers-"  # the handlers' groups of earlier versions, swept too
DAEMON_SHARES = 2048  # cpu.shares of a daemon and its handlers together: two processes
HANDLER_SHARES = 1024  # of the handlers' group where the kernel has no cpu.idle
DAEMON = "daemon"  # the daemon's own place in its group
BUSY = ".busy"  # the busy tenants' group beside it: queue-daemon-<pid>.busy
RT_PRIORITY = 1  # the lowest real-time priority, under the kernel's own real-time threads
RT_HOLD_S = 5.0  # real-time this long after the last busy mark
RT_THROTTLE = Path("/proc/sys/kernel/sched_rt_runtime_us")
_groups = itertools.count(1)


def v1_cpu_mount() -> Path | None:
    """Where the v1 ``cpu`` controller is mounted, or None."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split(" - ", 1)
        if len(fields) != 2:
            continue
        fstype, _source, options = [*fields[1].split(), "", "", ""][:3]
        if fstype == "cgroup" and "cpu" in options.split(","):
            return Path(fields[0].split()[4])
    return None


def _v1_cpu_dir() -> Path | None:
    """The daemon's own cgroup directory on the v1 ``cpu`` controller, or None."""
    mount = v1_cpu_mount()
    if mount is None:
        return None
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in own:
        _number, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return mount / path.lstrip("/")
    return None


class _Home:
    """The daemon's own CPU group, shared by its handlers' groups (one per sandbox)."""

    def __init__(self, path: Path, origin: Path) -> None:
        self.path = path
        self.origin = origin  # the cgroup the daemon came from, and goes back to
        self.users = 0
        self._busy: Path | None = None  # beside it: busy tenants' handlers, idle-class
        self._busy_lock = threading.Lock()
        self._rt_wanted: dict[int, float] = {}  # handlers' group id → real-time until
        self._rt = False  # the daemon's place runs real-time
        self._rt_lock = threading.Lock()
        self.server: Path | None = None  # the data dir of the PostgreSQL server started here

    def made_busy(self) -> Path | None:
        """The busy tenants' group if it was made (``busy``), else None."""
        with self._busy_lock:
            return self._busy

    def busy(self) -> Path | None:
        """``<origin>/queue-daemon-<pid>.busy``, idle-class beside every other group
        (made at its first use); None where it cannot be."""
        with self._busy_lock:
            if self._busy is None:
                path = self.origin / f"{self.path.name}{BUSY}"
                try:
                    path.mkdir(exist_ok=True)
                    (path / "cpu.idle").write_text("1")
                except OSError as exc:
                    logger.info(
                        "busy tenants' handlers stay in the daemon's CPU group (%s)",
                        exc,
                        extra={"action": "sandbox_cpu"},
                    )
                    remove(path)
                    return None
                self._busy = path
            return self._busy

    @classmethod
    def make(cls, origin: Path) -> _Home:
        path = origin / f"{PREFIX}{os.getpid()}"
        path.mkdir(exist_ok=True)
        try:
            (path / "cpu.shares").write_text(str(DAEMON_SHARES))
            (path / DAEMON).mkdir(exist_ok=True)
            (path / DAEMON / "cgroup.procs").write_text(str(os.getpid()))  # every thread
        except OSError:
            remove(path)
            raise
        return cls(path, origin)

    def realtime(self, group: object, wanted: bool | None) -> None:
        """The daemon's place real-time while any handlers' group (``group``) wants it,
        and ``RT_HOLD_S`` after (a tenant's busy mark can come and go with each check),
        normal again after the last (None: the group closed, at once); tasks started
        since the last call are raised too."""
        now = time.monotonic()
        with self._rt_lock:
            for key, until in list(self._rt_wanted.items()):
                if until <= now:
                    del self._rt_wanted[key]
            if wanted:
                self._rt_wanted[id(group)] = now + RT_HOLD_S
            elif wanted is None:
                self._rt_wanted.pop(id(group), None)
            if self._rt_wanted:
                self._rt = self._rt or self._grant_rt()
                if self._rt:
                    _set_realtime(self._rt_tasks(), True)
            elif self._rt:
                self._rt_off()

    def _grant_rt(self) -> bool:
        """Whether the daemon's place may run real-time: the kernel throttles real-time
        tasks, and where it budgets them by cgroup, the daemon's group got its parent's."""
        try:
            throttled = int(RT_THROTTLE.read_text()) > 0
        except (OSError, ValueError):
            throttled = False
        if not throttled:
            logger.info(
                "the daemon stays a normal process: real-time throttling is off",
                extra={"action": "sandbox_cpu"},
            )
            return False
        budget = self.origin / "cpu.rt_runtime_us"
        if not budget.exists():
            return True  # real-time time is not budgeted by cgroup here
        try:
            runtime = budget.read_text().strip()
            if int(runtime) <= 0:
                raise OSError(f"{budget} is {runtime}")
            (self.path / "cpu.rt_runtime_us").write_text(runtime)
            (self.path / DAEMON / "cpu.rt_runtime_us").write_text(runtime)
        except (OSError, ValueError) as exc:
            logger.info(
                "the daemon stays a normal process: no real-time budget for its CPU group (%s)",
                exc,
                extra={"action": "sandbox_cpu"},
            )
            self._revoke_rt()
            return False
        return True

    def _rt_tasks(self) -> list[int]:
        """The daemon's threads, and the processes of the server it started (the
        postmaster and its children in the daemon's place): not the processes the
        daemon starts for handlers, which pass through its place on their way to
        their own group, where a real-time process may not enter."""
        tids = _tasks(os.getpid())
        postmaster = _postmaster(self.server) if self.server is not None else None
        if postmaster is None:
            return tids
        try:
            pids = [int(pid) for pid in (self.path / DAEMON / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return tids
        for pid in pids:
            if pid == postmaster or _parent(pid) == postmaster:
                tids += _tasks(pid)
        return tids

    def _rt_off(self) -> None:
        _set_realtime(self._rt_tasks(), False)
        self._revoke_rt()
        self._rt = False

    def _revoke_rt(self) -> None:
        for group in (self.path / DAEMON, self.path):  # a child's budget first
            with contextlib.suppress(OSError):
                if (group / "cpu.rt_runtime_us").exists():
                    (group / "cpu.rt_runtime_us").write_text("0")

    def leave(self) -> None:
        with self._rt_lock:
            if self._rt:
                self._rt_off()  # real-time tasks cannot move into a group without a budget
        with contextlib.suppress(OSError):
            (self.origin / "cgroup.procs").write_text(str(os.getpid()))
        remove(self.path)
        if self._busy is not None:
            remove(self._busy)


_home: _Home | None = None
_home_lock = threading.Lock()  # find and close run in worker threads


class CpuGroup:
    """The CPU cgroup this daemon's handler processes run in, below the daemon's own."""

    def __init__(self, path: Path, home: _Home | None = None) -> None:
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
        tenant is busy the daemon's place runs real-time (``_Home.realtime``); call
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
        with _home_lock:
            return cls._find()

    @classmethod
    def _find(cls) -> CpuGroup | None:
        global _home
        home: _Home | None = None
        path: Path | None = None
        try:
            home = _home_now()
            if home is None:
                return None
            path = home.path / f"handlers-{next(_groups)}"
            path.mkdir(exist_ok=True)
            if (path / "cpu.idle").exists():
                (path / "cpu.idle").write_text("1")
            else:
                (path / "cpu.shares").write_text(str(HANDLER_SHARES))
        except OSError as exc:
            logger.info(
                "handlers keep the default CPU weight (%s)", exc, extra={"action": "sandbox_cpu"}
            )
            if path is not None:
                remove(path)
            if home is not None and home.users == 0:
                home.leave()
                _home = None
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
        _unuse(self.path.parent)


class DaemonPlace:
    """The daemon in its CPU group from start-up on, before any handler runs.

    A daemon that starts the embedded PostgreSQL takes its place first, so the
    server's processes start in the daemon's place and come before handlers as
    the daemon does (processes keep the cgroup they were started in)."""

    def __init__(self, home: _Home) -> None:
        self._home = home

    @classmethod
    def take(cls) -> DaemonPlace | None:
        """None where there is no such group (not root, no v1 cpu controller)."""
        if os.geteuid() != 0:
            return None
        with _home_lock:
            try:
                home = _home_now()
            except OSError as exc:
                logger.info("no CPU group (%s)", exc, extra={"action": "sandbox_cpu"})
                return None
            if home is None:
                return None
            home.users += 1
            return cls(home)

    def serve(self, pgdata: Path) -> None:
        """The PostgreSQL server in ``pgdata`` was started in this place: it runs
        real-time with the daemon (``_Home.realtime``)."""
        self._home.server = pgdata

    def release(self) -> None:
        """The daemon goes back where it was unless handlers' groups still use it;
        processes still in its place (a server it started) go back with it."""
        _unuse(self._home.path)


def _home_now() -> _Home | None:
    """The daemon's group, made (and the daemon moved in) if it is not yet; None where
    it cannot be. Under ``_home_lock``."""
    global _home
    if _home is None:
        origin = _v1_cpu_dir()
        if origin is None or not (origin / "cpu.shares").exists():
            return None
        sweep(origin)
        _home = _Home.make(origin)
    return _home


def _unuse(path: Path) -> None:
    global _home
    with _home_lock:
        home = _home
        if home is not None and path == home.path:
            home.users -= 1
            if home.users <= 0:
                home.leave()
                _home = None


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


def _tasks(pid: int) -> list[int]:
    """The threads of process ``pid`` (none if it ended)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
    except (OSError, ValueError, IndexError):
        return None


def _postmaster(pgdata: Path) -> int | None:
    """The pid of the server running in ``pgdata``, from its ``postmaster.pid``."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _set_realtime(tids: list[int], realtime: bool) -> None:
    """Every task (thread) of ``tids`` at real-time priority, or back to normal; tasks
    of another policy (batch, idle) and tasks that ended meanwhile are left."""
    normal, rt = os.SCHED_OTHER, os.SCHED_RR
    for tid in tids:
        with contextlib.suppress(OSError):
            policy = os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK
            if realtime and policy == normal:
                os.sched_setscheduler(tid, rt | os.SCHED_RESET_ON_FORK, os.sched_param(RT_PRIORITY))
            elif not realtime and policy == rt:
                os.sched_setscheduler(tid, normal, os.sched_param(0))


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
            prefix = PREFIX if entry.name.startswith(PREFIX) else OLD_PREFIX
            number = entry.name.removeprefix(prefix).split(".")[0]
            ours = entry.name.startswith(prefix) and number.isdigit() and entry.is_dir()
            if ours and int(number) != os.getpid() and not pid_alive(int(number)):
                _normal_again(entry / DAEMON)
                remove(entry)


def _normal_again(place: Path) -> None:
    """The processes left in a dead daemon's place (a server it started, raised while
    a tenant was busy) back to normal: nothing else would, and they move up next."""
    try:
        tids = [int(tid) for tid in (place / "tasks").read_text().split()]
    except (OSError, ValueError):
        return
    _set_realtime(tids, False)

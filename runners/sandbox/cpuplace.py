"""The daemon's own CPU group (its place), shared by its handlers' groups, and the
real-time hold of that place while a tenant is busy (see ``queue_daemon.runners.sandbox.cpushare``
for the handlers' groups).

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
import logging
import os
import threading
import time
from pathlib import Path

from queue_daemon.runners.sandbox.cgroups import pid_alive

logger = logging.getLogger(__name__)

PREFIX = "queue-daemon-"
OLD_PREFIX = "queue-handlers-"  # the handlers' groups of earlier versions, swept too
DAEMON_SHARES = 2048  # cpu.shares of a daemon and its handlers together: two processes
HANDLER_SHARES = 1024  # of the handlers' group: the daemon's own weight
DAEMON = "daemon"  # the daemon's own place in its group
BUSY = ".busy"  # the busy tenants' group beside it: queue-daemon-<pid>.busy
RT_PRIORITY = 1  # the lowest real-time priority, under the kernel's own real-time threads
RT_HOLD_S = 5.0  # real-time this long after the last busy mark
RT_THROTTLE = Path("/proc/sys/kernel/sched_rt_runtime_us")


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


class Home:
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
    def make(cls, origin: Path) -> Home:
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


_home: Home | None = None
HOME_LOCK = threading.Lock()  # find and close run in worker threads


class DaemonPlace:
    """The daemon in its CPU group from start-up on, before any handler runs.

    A daemon that starts the embedded PostgreSQL takes its place first, so the
    server's processes start in the daemon's place and share its weight (processes
    keep the cgroup they were started in)."""

    def __init__(self, home: Home) -> None:
        self._home = home

    @classmethod
    def take(cls) -> DaemonPlace | None:
        """None where there is no such group (not root, no v1 cpu controller)."""
        if os.geteuid() != 0:
            return None
        with HOME_LOCK:
            try:
                home = home_now()
            except OSError as exc:
                logger.info("no CPU group (%s)", exc, extra={"action": "sandbox_cpu"})
                return None
            if home is None:
                return None
            home.users += 1
            return cls(home)

    def serve(self, pgdata: Path) -> None:
        """The PostgreSQL server in ``pgdata`` was started in this place: it runs
        real-time with the daemon (``Home.realtime``)."""
        self._home.server = pgdata

    def release(self) -> None:
        """The daemon goes back where it was unless handlers' groups still use it;
        processes still in its place (a server it started) go back with it."""
        unuse(self._home.path)


def home_now() -> Home | None:
    """The daemon's group, made (and the daemon moved in) if it is not yet; None where
    it cannot be. Under ``HOME_LOCK``."""
    global _home
    if _home is None:
        origin = _v1_cpu_dir()
        if origin is None or not (origin / "cpu.shares").exists():
            return None
        sweep(origin)
        _home = Home.make(origin)
    return _home


def drop_home(home: Home) -> None:
    """The daemon leaves ``home``, which nothing uses any more. Under ``HOME_LOCK``."""
    global _home
    home.leave()
    if _home is home:
        _home = None


def unuse(path: Path) -> None:
    """One user less of the daemon's group at ``path``; with the last, the daemon goes
    back where it came from."""
    global _home
    with HOME_LOCK:
        home = _home
        if home is not None and path == home.path:
            home.users -= 1
            if home.users <= 0:
                home.leave()
                _home = None


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

"""How a handler process is started: scrubbed environment, private directory,
resource limits, its own process group, an unprivileged user.

A handler process is started through two tiny exec wrappers, never through a
``preexec_fn`` (which is unsafe in a threaded daemon and forbids vfork):

    /bin/sh -c 'exec 3<&0 4>&1 0</dev/null 1>&2; exec "$@"'     (contexts only: the
        protocol pipes, started as stdin/stdout, become fds 3 and 4 (PROTOCOL.md);
        the child's stdout and stderr then share one pipe of context-level output)
    prlimit --as=… --cpu=… --nofile=… --nproc=… --fsize=… --core=0 --
        (``--data`` instead of ``--as`` for runtimes that reserve huge address
        ranges up front: node/V8 cannot start under a 1 GiB RLIMIT_AS)
        (util-linux; where it is missing, ``bootstrap/limits.py`` does the same)
    the command itself

``subprocess`` starts a new session, so the whole tree can be killed with
one ``killpg``. The switch to the run-as user is util-linux ``unshare``'s
(``--setgid --setuid``, clearing supplementary groups), run as root after the
wrappers that need root; only where there is no ``unshare`` does the loop's
``subprocess_exec`` switch (``user=``, ``group=``, ``extra_groups=[]``: asyncio's
loop, not uvloop's). When handlers get no network (the default when the daemon
is root and ``unshare`` works), that first wrapper also puts the process in a
new network namespace (only a loopback interface of its own: no route to the
host's loopback or anywhere else):

    unshare --net --setgid=G --setuid=U --    (before everything above)

When iproute2's ``ip`` works there, the namespace's loopback is brought up
first (still as root, inside the namespace), so a handler can use 127.0.0.1
within its own tree; the user switch is then a second ``unshare`` without
namespaces:

    unshare --net -- /bin/sh -c '"$1" link set lo up; …; exec "$@"' sh IP
        unshare --setgid=G --setuid=U --

A process group does not hold a tree whose members call ``setsid()``: when the
daemon is root and cgroup v2 is there (``queue_daemon.runners.sandbox.cgroups``), every context and
shell job also gets a cgroup of its own, which the very first wrapper (root)
enters before anything of the handler runs; killing a tree then also writes
``cgroup.kill``, which nothing in the cgroup can leave or escape. With cgroups
but no network namespace (``network=True``), ``unshare`` without ``--net``
still does the user switch, since the wrapper must run as root:

    /bin/sh -c 'echo 1000 >/proc/self/oom_score_adj; echo $$ >"$1"; shift; exec "$@"'
        sh CGROUP/cgroup.procs

That first wrapper runs for every handler process, with or without cgroups:
its ``oom_score_adj`` of 1000 makes a handler the kernel's first choice when
memory runs out, before the daemon or PostgreSQL (set by root with
``CAP_SYS_RESOURCE``, a handler cannot lower it again; without that
capability it can, down to 0).

A namespace does not cover unix sockets, which are files: the daemon's own
files are kept from handlers by permissions (``queue_daemon.app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queue_daemon.runners.errors import SandboxError
from queue_daemon.runners.sandbox.cgroups import CgroupTree
from queue_daemon.runners.sandbox.cpushare import CpuGroup
from queue_daemon.runners.sandbox.probes import (
    SAFE_PATH,
    find_ip,
    find_private_mounts,
    find_python,
    find_unshare,
    scrubbed_env,
)
from queue_daemon.runners.sandbox.process import Child, _Protocol
from queue_daemon.runners.sandbox.users import RunAs, TenantUids, resolve_run_as, tenant_ids
from queue_daemon.runners.sandbox.workdirs import OwnPart

logger = logging.getLogger(__name__)

BOOTSTRAP_SOURCE = Path(__file__).resolve().parents[1] / "bootstrap"
# moves the protocol pipes from fds 0/1 to 3/4 (dash only knows fds 0-9 in redirections)
_FD_WRAPPER = 'unset PWD OLDPWD; exec 3<&0 4>&1 0</dev/null 1>&2; exec "$@"'
# the first wrapper, as root when the daemon is: makes the process the kernel's
# first choice when memory runs out (``OOM_SCORE_ADJ``; set by root, a handler
# cannot lower it again), enters the cgroups whose cgroup.procs files come
# before ``--``, then becomes the rest
OOM_SCORE_ADJ = 1000
_FIRST_WRAPPER = (
    f"unset PWD OLDPWD; echo {OOM_SCORE_ADJ} >/proc/self/oom_score_adj 2>/dev/null;"
    ' while [ "$1" != -- ]; do echo $$ >"$1" || exit 126; shift; done; shift; exec "$@"'
)
# run as root in the new namespaces: brings the loopback up with ip ($1, if any),
# mounts a private tmpfs of $2 bytes on /dev/shm and, when $3 is 1, on /tmp
_NAMESPACE_WRAPPER = (
    'unset PWD OLDPWD; if [ -n "$1" ]; then "$1" link set lo up || exit 126; fi;'
    ' if [ -n "$2" ]; then'
    ' mount -t tmpfs -o "size=$2,mode=1777,nosuid,nodev" tmpfs /dev/shm || exit 126;'
    ' if [ "$3" = 1 ]; then'
    ' mount -t tmpfs -o "size=$2,mode=1777,nosuid,nodev" tmpfs /tmp || exit 126; fi; fi;'
    ' shift 3; exec "$@"'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Resource limits of every handler process (setrlimit, soft = hard)."""

    memory_bytes: int = 1 << 30  # RLIMIT_AS (node: RLIMIT_DATA, see Sandbox.spawn)
    cpu_seconds: int = 3600  # RLIMIT_CPU, over the life of a context
    open_files: int = 256  # RLIMIT_NOFILE
    processes: int = 64  # RLIMIT_NPROC: counts every process and thread of the uid
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE
    shm_bytes: int = 64 << 20  # the private /dev/shm (and /tmp) of each process tree


class Sandbox:
    """Starts handler processes under the limits, user and directory rules above."""

    def __init__(
        self,
        *,
        work_root: Path,
        limits: Limits,
        run_as: str | None = None,
        prlimit: str | None = "auto",
        python: str | None = None,
        network: bool = False,
        realtime: bool = False,
        tenant_uids: TenantUids | None = None,
    ) -> None:
        self.work_root = work_root
        self._tenant_uids = tenant_uids  # None: uids derived from the names (tenant_ids)
        self.network = network
        self.realtime = realtime
        self.limits = limits
        self._run_as_setting = run_as
        self._prlimit_setting = prlimit
        self._python_setting = python
        self.python = python or sys.executable
        self._prepared = False
        # the making, in a thread that runs on even if its awaiting caller is
        # cancelled: ``close`` waits for it, so nothing it makes is left behind
        self._preparing: asyncio.Future[None] | None = None
        self._closed = False
        self.run_as: RunAs | None = None
        self.bootstrap_dir = work_root / "bootstrap"
        self._prlimit: str | None = None
        self._unshare: str | None = None  # set when handlers get a network namespace
        self._ip: str | None = None  # iproute2, to bring the namespace's loopback up
        self._private_mounts = False  # IPC and mount namespaces with a private /dev/shm
        self._private_tmp = False  # ... and /tmp (not when the daemon's files are below it)
        self._switch_user: str | None = None  # unshare, to switch users after the cgroup wrapper
        self._cgroups: CgroupTree | None = None
        self._cpu: CpuGroup | None = None  # the handlers' CPU group, below the daemon's
        self._busy: frozenset[str] = frozenset()  # tenants marked busy (mark_busy)
        self._part: OwnPart | None = None  # this sandbox's d-<id> below the work root

    async def prepare(self) -> None:
        """Resolve the user, make the work root and copy the bootstraps; once."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._prepared:
            return
        if self._preparing is None:
            self._preparing = asyncio.ensure_future(asyncio.to_thread(self._prepare))
        preparing = self._preparing
        try:
            await asyncio.shield(preparing)
        except BaseException:
            if preparing.done() and self._preparing is preparing:
                self._preparing = None  # it failed: the next call tries again
            raise
        self._prepared = True

    def _prepare(self) -> None:
        self.run_as = resolve_run_as(self._run_as_setting)
        root = self.work_root
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        if self.run_as is not None:
            # the run-as user must reach its directory below the root, nothing more
            os.chmod(root, os.stat(root).st_mode & 0o7777 | 0o011)
            for parent in root.resolve().parents:
                if not os.stat(parent).st_mode & 0o001:
                    raise SandboxError(
                        f"handlers cannot reach the work root {root}: {parent} "
                        "is not searchable by other users"
                    )
        self._copy_bootstraps()
        self._part = OwnPart.claim(root)
        prlimit = self._prlimit_setting
        if prlimit == "auto":
            prlimit = shutil.which("prlimit", path=SAFE_PATH)
        self._prlimit = prlimit
        self.python = find_python(self._python_setting, self.run_as, self.work_root)
        self._unshare = None if self.network else find_unshare(self.run_as, self.work_root)
        self._ip = find_ip(self._unshare, self.work_root) if self._unshare else None
        if self._unshare is not None:
            self._private_mounts = find_private_mounts(self._unshare, self.work_root)
            self._private_tmp = self._private_mounts and not any(
                _below_tmp(path)
                for path in (root, Path(self.python), Path(sys.executable), Path(sys.prefix))
            )
        self._cgroups = self._find_cgroups()

    @property
    def private_tmp(self) -> bool:
        """Whether handlers get a private tmpfs on /tmp (not when the daemon's own
        files, its work root or its interpreter, lie below /tmp: it would hide them)."""
        return self._private_tmp

    @property
    def has_loopback(self) -> bool:
        """Whether handlers in a network namespace get its loopback up (127.0.0.1 works)."""
        return self._unshare is not None and self._ip is not None

    def _find_cgroups(self) -> CgroupTree | None:
        """This daemon's cgroup for handler trees, or None (warned: ``setsid`` escapes kills)."""
        if self.run_as is None:
            return None  # not root: nothing to warn about beyond the run-as notice
        self._switch_user = self._unshare or shutil.which("unshare", path=SAFE_PATH)
        cgroups = CgroupTree.find() if self._switch_user is not None else None
        self._cpu = CpuGroup.find() if self._switch_user is not None else None
        if self._cpu is not None:
            self._cpu.realtime = self.realtime
        if self._cpu is not None and self._busy:
            self._cpu.mark_busy(self._busy_uids())
        if self._cpu is None:
            logger.info(
                "handlers keep the kernel's default CPU weight (no cgroup v1 cpu controller)",
                extra={"action": "sandbox_cpu"},
            )
        if cgroups is None:
            logger.warning(
                "no cgroup v2 for handlers: a handler process that calls setsid() "
                "survives its job's timeout and its context",
                extra={"action": "sandbox_cgroup"},
            )
        return cgroups

    async def mark_busy(self, clients: Set[str]) -> None:
        """Put the handlers of ``clients`` (busy tenants) behind other tenants' on a
        wake-up (``CpuGroup.mark_busy``); the others' are no longer. Nothing where
        handlers have no CPU group."""
        self._busy = frozenset(clients)  # marked as the CPU group is made, if not yet
        cpu = self._cpu
        if cpu is not None:
            await asyncio.to_thread(cpu.mark_busy, self._busy_uids())

    def _busy_uids(self) -> set[int]:
        return {run_as.uid for client in self._busy if (run_as := self.owner(client)) is not None}

    @property
    def contains_processes(self) -> bool:
        """Whether every handler process tree is held (and killed) by a cgroup of its own."""
        return self._cgroups is not None

    async def close(self) -> None:
        """Remove this sandbox's cgroup (killing anything still in it) and its directory."""
        self._closed = True
        preparing = self._preparing
        if preparing is not None and not preparing.done():
            # what the making thread makes is removed below, once it is made
            with contextlib.suppress(Exception):
                await asyncio.shield(preparing)
        cgroups, self._cgroups = self._cgroups, None
        if cgroups is not None:
            await asyncio.to_thread(cgroups.close)
        cpu, self._cpu = self._cpu, None
        if cpu is not None:
            await asyncio.to_thread(cpu.close)
        part, self._part = self._part, None
        if part is not None:
            await asyncio.to_thread(part.release)

    @staticmethod
    async def release(child: Child) -> None:
        """Once ``child`` exited: kill what is left of its tree and remove its cgroup."""
        cgroup, child.cgroup = child.cgroup, None
        if cgroup is not None:
            await asyncio.to_thread(CgroupTree.remove, cgroup)

    @property
    def isolates_network(self) -> bool:
        """Whether handler processes run in a network namespace of their own."""
        return self._unshare is not None

    def _copy_bootstraps(self) -> None:
        """Bootstraps live where the run-as user can read them, whatever the install path."""
        target = self.bootstrap_dir
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

    def limits_argv(self, *, memory: str = "as") -> list[str]:
        """The wrapper that applies the limits; ``memory`` "as" (address space) or "data"."""
        lim = self.limits
        values = {
            memory: lim.memory_bytes,
            "cpu": lim.cpu_seconds,
            "nofile": lim.open_files,
            "nproc": lim.processes,
            "fsize": lim.file_bytes,
            "core": 0,
        }
        if self._prlimit:
            return [self._prlimit, *(f"--{name}={value}" for name, value in values.items()), "--"]
        script = str(self.bootstrap_dir / "limits.py")
        pairs = (f"{name}={value}" for name, value in values.items())
        return [self.python, "-I", "-S", script, *pairs, "--"]

    def bootstrap(self, name: str) -> str:
        return str(self.bootstrap_dir / name)

    def owner(self, client: str) -> RunAs | None:
        """Who runs ``client``'s handlers: None when the daemon is not root (itself),
        the configured run-as user if one was given, else the tenant's own ids."""
        if self.run_as is None:
            return None
        if self._run_as_setting is not None:
            return self.run_as
        if self._tenant_uids is not None:
            return self._tenant_uids.of(client)
        return tenant_ids(client)

    def make_dir(self, prefix: str, client: str) -> Path:
        """A new private directory (0700, owned by the client's user) in this sandbox's part
        of the work root (``queue_daemon.runners.sandbox.workdirs``)."""
        if self._part is None:
            raise SandboxError("the sandbox is closed")
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=self._part.path))
        owner = self.owner(client)
        if owner is not None:
            os.chown(path, owner.uid, owner.gid)
        return path

    @staticmethod
    def remove_dir(path: Path) -> None:
        """Blocking: run it through ``asyncio.to_thread``."""
        shutil.rmtree(path, ignore_errors=True)

    async def spawn(
        self,
        command: list[str],
        *,
        client: str,
        home: Path,
        pipes: tuple[int, int] | None = None,
        stdin: int = subprocess.DEVNULL,
        memory: str = "as",
        env: Mapping[str, str] | None = None,
    ) -> Child:
        """Start ``command`` in ``home``, with ``env`` added to its scrubbed environment.

        With ``pipes`` (the child's read end, its write end) they become the child's
        fds 3 and 4, its stdout and stderr both go to ``proc.stderr`` and ``proc.stdout``
        is None; the caller closes its copies of ``pipes`` after this returns.
        """
        await self.prepare()
        argv = [*self.limits_argv(memory=memory), *command]
        stdout: int = subprocess.PIPE
        if pipes is not None:
            argv = ["/bin/sh", "-c", _FD_WRAPPER, "sh", *argv]
            stdin, stdout = pipes
        run_as = self.owner(client)
        cgroup: Path | None = None
        if run_as is not None and self._cgroups is not None and self._switch_user is not None:
            cgroup = self._cgroups.new()
        # the files a root wrapper writes the process's pid to before handler code runs
        procs = [] if cgroup is None else [cgroup / "cgroup.procs"]
        if run_as is not None and self._cpu is not None and self._switch_user is not None:
            procs.append(self._cpu.procs(run_as.uid))
        if run_as is not None and self._switch_user is not None:
            # unshare needs root: it switches to the run-as user itself, after the namespace
            # (and after the cgroup wrapper, which must write to root's cgroup files)
            unshare = self._unshare or self._switch_user
            assert unshare is not None
            switch = [unshare, f"--setgid={run_as.gid}", f"--setuid={run_as.uid}", "--"]
            if self._unshare is None:
                argv = [*switch, *argv]
            elif self._ip is None and not self._private_mounts:
                argv = [unshare, "--net", *switch[1:], *argv]
            else:
                spaces = ["--net"]
                shm = tmp = ""
                if self._private_mounts:
                    spaces += ["--ipc", "--mount", "--propagation", "private"]
                    shm, tmp = str(self.limits.shm_bytes), "1" if self._private_tmp else ""
                inner = ["/bin/sh", "-c", _NAMESPACE_WRAPPER, "sh", self._ip or "", shm, tmp]
                argv = [unshare, *spaces, "--", *inner, *switch, *argv]
            run_as = None
        argv = ["/bin/sh", "-c", _FIRST_WRAPPER, "sh", *map(str, procs), "--", *argv]
        # without unshare, subprocess switches the user (uvloop's loop cannot: it
        # takes no user=, so the daemon runs on it only when unshare is there)
        switch_by_subprocess: dict[str, Any] = (
            {} if run_as is None else {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}
        )
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Protocol(1 << 16, loop),
                *argv,
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.PIPE,
                cwd=home,
                env=scrubbed_env(home) if env is None else {**scrubbed_env(home), **env},
                start_new_session=True,
                **switch_by_subprocess,
            )
        except BaseException as exc:
            if cgroup is not None:
                await asyncio.to_thread(CgroupTree.remove, cgroup)
            if isinstance(exc, ValueError) and switch_by_subprocess:
                # uvloop: "unexpected kwargs: user, group, extra_groups"
                raise OSError(
                    f"{exc}: switching to the run-as user needs util-linux unshare on this"
                    " event loop (or --event-loop asyncio)"
                ) from None
            raise
        child = Child(transport, protocol, loop)
        child.cgroup = cgroup
        return child


def _below_tmp(path: Path) -> bool:
    """Whether ``path`` lies below /tmp, which a private /tmp would hide."""
    try:
        return Path(os.path.realpath(path)).is_relative_to("/tmp")
    except (OSError, ValueError):
        return True

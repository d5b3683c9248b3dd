"""How a handler process is started: scrubbed environment, private directory,
resource limits (``rlimits``), its own process group, an unprivileged user, a
cgroup, behind bubblewrap's minimal view and the seccomp filter (``walls``), or
where those cannot stand, in util-linux ``unshare``'s namespaces, through the
exec wrappers ``wrappers`` describes.

Without the view a namespace does not cover unix sockets, which are files: the
daemon's own files are kept from handlers by permissions (``queue_daemon.app``).
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
from pathlib import Path
from typing import Any

from queue_daemon.runners.errors import SandboxError
from queue_daemon.runners.sandbox.bootstraps import copy_bootstraps
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
from queue_daemon.runners.sandbox.process import Child, start_process
from queue_daemon.runners.sandbox.rlimits import ProcessLimits, limits_argv
from queue_daemon.runners.sandbox.users import RunAs, TenantUids, resolve_run_as, tenant_ids
from queue_daemon.runners.sandbox.walls import Walls
from queue_daemon.runners.sandbox.workdirs import OwnPart
from queue_daemon.runners.sandbox.wrappers import fd_argv, first_argv, switch_argv

logger = logging.getLogger(__name__)


class Sandbox:
    """Starts handler processes under the limits, user and directory rules above."""

    def __init__(
        self,
        *,
        work_root: Path,
        limits: ProcessLimits,
        run_as: str | None = None,
        prlimit: str | None = "auto",
        python: str | None = None,
        network: bool = False,
        share: tuple[Path, ...] = (),
        bwrap: str | None = "auto",
        realtime: bool = False,
        tenant_uids: TenantUids | None = None,
    ) -> None:
        self.work_root = work_root
        self._tenant_uids = tenant_uids  # None: uids derived from the names (tenant_ids)
        self.network = network
        self.share = share  # bound read-write into every view (``walls``)
        self._bwrap_setting = bwrap  # "auto": bubblewrap from the safe PATH; None: none
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
        self._walls: Walls | None = None  # bubblewrap's view and the filter, where they work

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
        copy_bootstraps(self.bootstrap_dir)
        part = self._part = OwnPart.claim(root)
        prlimit = self._prlimit_setting
        if prlimit == "auto":
            prlimit = shutil.which("prlimit", path=SAFE_PATH)
        self._prlimit = prlimit
        self.python = find_python(self._python_setting, self.run_as, self.work_root)
        self._walls = Walls.find(
            part=part.path,
            bootstrap_dir=self.bootstrap_dir,
            run_as=self.run_as,
            python=self.python,
            network=self.network,
            tmp_size=self.limits.tmp_size,
            share=self.share,
            bwrap=self._bwrap_setting,
        )
        if self._walls is None:  # the fewer walls util-linux unshare builds (as root)
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
        """Whether handlers get a private tmpfs on /tmp (without the view, not when
        the daemon's own files, its work root or its interpreter, lie below /tmp)."""
        return self._walls is not None or self._private_tmp

    @property
    def has_loopback(self) -> bool:
        """Whether handlers in a network namespace get its loopback up (127.0.0.1 works)."""
        return self._walls is not None or (self._unshare is not None and self._ip is not None)

    @property
    def unwalled(self) -> bool:
        """Whether nothing stands between tenants' handlers: not root (one uid for
        all) and no bubblewrap's namespaces."""
        return self.run_as is None and self._walls is None

    @property
    def walled(self) -> bool:
        """Whether handlers see the minimal view (bubblewrap: namespaces, no_new_privs)."""
        return self._walls is not None

    @property
    def filtered(self) -> bool:
        """Whether handlers run under the seccomp filter (``syscalls``)."""
        return self._walls is not None and self._walls.filtered

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
        if cgroups is None and self._walls is not None:
            logger.warning(
                "no cgroup v2 for handlers: their PID namespaces still end every process"
                " of a context or job with it, but nothing counts a tenant's CPU apart",
                extra={"action": "sandbox_cgroup"},
            )
        elif cgroups is None:
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
        if self._walls is not None:
            return not self.network
        return self._unshare is not None

    def limits_argv(self, *, memory: str = "as") -> list[str]:
        """The wrapper that applies the limits; ``memory`` "as" (address space) or "data"."""
        script = str(self.bootstrap_dir / "limits.py")
        return limits_argv(
            self.limits, memory=memory, prlimit=self._prlimit, python=self.python, script=script
        )

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
            argv = [*fd_argv(), *argv]
            stdin, stdout = pipes
        run_as = self.owner(client)
        cgroup: Path | None = None
        if run_as is not None and self._cgroups is not None and self._switch_user is not None:
            cgroup = self._cgroups.new()
        # the files a root wrapper writes the process's pid to before handler code runs
        procs = [] if cgroup is None else [cgroup / "cgroup.procs"]
        if run_as is not None and self._cpu is not None and self._switch_user is not None:
            procs.append(self._cpu.procs(run_as.uid))
        walls, seccomp_fd = self._walls, None
        switch_by_subprocess: dict[str, Any] = {}
        try:
            if walls is not None:
                seccomp_fd = walls.open_filter()
                argv = [*walls.argv(run_as, home, seccomp_fd), *argv]
                run_as = None  # switched by the walls' own argv
            elif run_as is not None and self._switch_user is not None:
                switch = switch_argv(
                    run_as,
                    switch_user=self._switch_user,
                    unshare=self._unshare,
                    ip=self._ip,
                    private_mounts=self._private_mounts,
                    private_tmp=self._private_tmp,
                    tmp_size=self.limits.tmp_size,
                )
                argv = [*switch, *argv]
                run_as = None
            argv = [*first_argv(procs), *argv]
            # without unshare, subprocess switches the user
            if run_as is not None:
                switch_by_subprocess = {
                    "user": run_as.uid,
                    "group": run_as.gid,
                    "extra_groups": [],
                }
            child = await start_process(
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.PIPE,
                cwd=home,
                env=scrubbed_env(home) if env is None else {**scrubbed_env(home), **env},
                start_new_session=True,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                **switch_by_subprocess,
            )
        except BaseException:
            if cgroup is not None:
                await asyncio.to_thread(CgroupTree.remove, cgroup)
            raise
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        child.cgroup = cgroup
        child.through_walls = walls is not None
        return child


def _below_tmp(path: Path) -> bool:
    """Whether ``path`` lies below /tmp, which a private /tmp would hide."""
    try:
        return Path(os.path.realpath(path)).is_relative_to("/tmp")
    except (OSError, ValueError):
        return True

"""The walls that need no trust in the host: bubblewrap's minimal view
(``view``) and the seccomp filter (``syscalls``), found once per sandbox by
running ``true`` behind them as the handlers' user, and the argv that puts a
handler process behind them.

As root the process first becomes the tenant's uid (util-linux ``unshare
--setgid --setuid``, no namespaces), then bubblewrap makes its namespaces as
that user; without root bubblewrap runs as the daemon's user. Either way the
same walls stand where the kernel lets users make user namespaces.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from queue_daemon.runners.sandbox.probes import SAFE_PATH, python_paths, scrubbed_env
from queue_daemon.runners.sandbox.syscalls import write_filter
from queue_daemon.runners.sandbox.users import RunAs
from queue_daemon.runners.sandbox.view import View, identity_files, narrowed
from queue_daemon.runners.sandbox.wrappers import user_argv

logger = logging.getLogger(__name__)

WHOLE = "handlers see the whole file system and may make every system call"


class Walls:
    """bubblewrap's view with the filter (when libseccomp compiles it) for one sandbox."""

    def __init__(
        self, view: View, seccomp: Path | None, unshare: str | None, ids_dir: Path
    ) -> None:
        self.view = view
        self._seccomp = seccomp  # the compiled filter, read by bubblewrap from a descriptor
        self._unshare = unshare  # util-linux unshare, for root's switch to the tenant's ids
        self._ids_dir = ids_dir  # where the passwd and group files of each uid are made
        self._ids: dict[tuple[int, int], Path] = {}

    @property
    def filtered(self) -> bool:
        return self._seccomp is not None

    @classmethod
    def find(
        cls,
        *,
        part: Path,
        bootstrap_dir: Path,
        run_as: RunAs | None,
        python: str,
        network: bool,
        tmp_size: int,
        share: tuple[Path, ...] = (),
        bwrap: str | None = "auto",
    ) -> Walls | None:
        """The walls, where they work here for ``run_as`` (None: the daemon's own
        user), else None (warned). Blocking: run it in a thread."""
        if bwrap == "auto":
            bwrap = shutil.which("bwrap", path=SAFE_PATH)
        if bwrap is None:
            logger.warning(
                "%s: bubblewrap is missing (Debian: apt-get install bubblewrap)",
                WHOLE,
                extra={"action": "sandbox_view"},
            )
            return None
        seccomp: Path | None = part / "seccomp.bpf"
        assert seccomp is not None
        why = write_filter(seccomp)
        if why is not None:
            logger.warning(
                "handlers may make every system call: %s", why, extra={"action": "sandbox_filter"}
            )
            seccomp = None
        # the handlers' python, the daemon's packages (node's wheel), the bootstraps;
        # never a directory that holds the daemon's data or the work root
        daemon = sysconfig.get_paths()
        paths = [Path(daemon["purelib"]), Path(daemon["platlib"]), bootstrap_dir]
        paths += [Path(p) for p in python_paths(python, run_as, part)]
        work_root = bootstrap_dir.parent
        private = [work_root, work_root.parent, Path.home()]
        readonly = tuple(p for p in narrowed(paths, private) if run_as is None or _open_to_all(p))
        shown = [Path(os.path.realpath(p)) for p in share]
        for path in [p for p in shown if any(h.is_relative_to(p) for h in private)]:
            logger.warning(
                "--handler-share %s is not shared: it holds the daemon's data",
                path,
                extra={"action": "sandbox_share"},
            )
        share = tuple(p for p in shown if not any(h.is_relative_to(p) for h in private))
        view = View(bwrap=bwrap, readonly=readonly, network=network, tmp_size=tmp_size, share=share)
        walls = cls(view, seccomp, shutil.which("unshare", path=SAFE_PATH), part)
        why = walls._probe(run_as, part)
        if why is not None:
            logger.warning(
                "%s: bubblewrap fails here (%s)", WHOLE, why, extra={"action": "sandbox_view"}
            )
            return None
        return walls

    def open_filter(self) -> int | None:
        """A new descriptor of the filter for one process (its own offset: bubblewrap
        reads it whole); the caller closes it once the process started."""
        return None if self._seccomp is None else os.open(self._seccomp, os.O_RDONLY)

    def argv(self, run_as: RunAs | None, home: Path, seccomp_fd: int | None) -> list[str]:
        """What a process of ``run_as`` in ``home`` is started through, before its
        own command (as root: the switch to ``run_as`` first)."""
        key = (os.getuid(), os.getgid()) if run_as is None else (run_as.uid, run_as.gid)
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = identity_files(self._ids_dir, *key)
        return [*self._switch(run_as), *self.view.argv(home, ids, seccomp_fd)]

    def _switch(self, run_as: RunAs | None) -> list[str]:
        if run_as is None:
            return []
        if self._unshare is None:
            raise OSError("util-linux unshare is missing: the switch to the handlers' user")
        return user_argv(self._unshare, run_as)

    def _probe(self, run_as: RunAs | None, part: Path) -> str | None:
        """Why ``true`` does not run behind the walls as ``run_as``, or None."""
        home = Path(tempfile.mkdtemp(prefix="probe-", dir=part))
        try:
            if run_as is not None:
                os.chown(home, run_as.uid, run_as.gid)
            fd = self.open_filter()
            try:
                done = subprocess.run(
                    [*self.argv(run_as, home, fd), "/bin/true"],
                    env=scrubbed_env(home),
                    cwd="/",
                    capture_output=True,
                    timeout=30,
                    check=False,
                    pass_fds=() if fd is None else (fd,),
                )
            finally:
                if fd is not None:
                    os.close(fd)
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        if done.returncode == 0:
            return None
        return done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"


def _open_to_all(path: Path) -> bool:
    """Whether any user can reach and read ``path`` (a tenant's uid owns nothing)."""
    try:
        mode = os.stat(path).st_mode
        needed = 0o005 if stat.S_ISDIR(mode) else 0o004
        if mode & needed != needed:
            return False
        return all(os.stat(parent).st_mode & 0o001 for parent in path.parents)
    except OSError:
        return False

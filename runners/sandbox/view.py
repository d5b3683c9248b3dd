"""The minimal view: what a handler process sees of the machine, built by
bubblewrap (Debian's ``bubblewrap``; chosen over more mount code of our own:
it is small, audited, and builds the same walls as root and without root).

bubblewrap starts the handler in new user, mount, PID, IPC, UTS and cgroup
namespaces (and network, unless handlers are given the network) as the user
it was started as: as root the daemon first switches to the tenant's uid
(``wrappers.switch_argv``), so the user namespace maps that uid to itself and
nothing of root is left; without root it maps the daemon's own. It forbids
user namespaces inside (``--disable-userns``), gives a host name of its own, sets
``no_new_privs``, drops every capability, loads the seccomp filter
(``syscalls``) last, and the handler then sees, besides its own directory
(read-write):

- read-only: ``/usr`` (with ``/bin``, ``/lib``, ``/sbin`` as the host links or
  binds them), what the interpreter needs when it lies elsewhere (its standard
  library and packages, its executable's directory, a virtualenv's
  ``pyvenv.cfg``; the daemon's packages, which hold node's wheel), the
  bootstraps; never a directory that holds the work root or the daemon's data;
- a small ``/etc``: ``passwd`` and ``group`` holding only the handler's uid
  and gid, the loader's cache, the time zone, ``alternatives``; name
  resolution and certificates only when handlers have the network;
- private tmpfs on ``/tmp`` and ``/dev/shm`` (``--tmp-size`` each), bubblewrap's
  ``/dev`` (``null``, ``zero``, ``full``, ``random``, ``urandom``, ``tty``, ``pts``),
  and a ``/proc`` of its own PID namespace.

The daemon's data, other tenants' directories, ``/home``, ``/root`` and
``/var`` are not there. When the PID namespace's first process (bubblewrap's)
dies, the kernel kills every process in it: a ``setsid()`` child does not
outlive its context even without cgroups.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# the top-level names merged-/usr systems link into /usr (else bound as they are)
TOP_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")
ETC_ALWAYS = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
ETC_NETWORK = (
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
)


@dataclass(frozen=True)
class View:
    """How handler processes are started through bubblewrap."""

    bwrap: str
    readonly: tuple[Path, ...]  # beside /usr: the interpreters' installations, the bootstraps
    network: bool  # handlers keep the host's network (no network namespace)
    tmp_size: int  # bytes of each private tmpfs
    share: tuple[Path, ...] = ()  # read-write, the same for every tenant (--handler-share)

    @functools.cached_property
    def _system(self) -> tuple[str, ...]:
        """The part of every process's argv up to its own ``/etc`` files: the
        namespaces and the system's paths, looked up once (not at each spawn)."""
        argv = [self.bwrap, "--unshare-user", "--disable-userns", "--unshare-ipc"]
        argv += ["--unshare-pid", "--unshare-uts", "--hostname", "handler"]
        argv += ["--unshare-cgroup-try", "--die-with-parent"]
        if not self.network:
            argv.append("--unshare-net")
        argv += ["--ro-bind", "/usr", "/usr"]
        for name in TOP_LINKS:
            top = Path("/", name)
            if top.is_symlink():
                argv += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                argv += ["--ro-bind", str(top), str(top)]
        for name in (*ETC_ALWAYS, *(ETC_NETWORK if self.network else ())):
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        return tuple(argv)

    def argv(self, home: Path, ids: Path, seccomp_fd: int | None) -> list[str]:
        """bubblewrap's argv for a process in ``home`` whose ``/etc/passwd`` and
        ``/etc/group`` are ``ids``'s (``identity_files``), with the filter read
        from ``seccomp_fd`` (None: no filter)."""
        argv = [*self._system]
        argv += ["--ro-bind", str(ids / "passwd"), "/etc/passwd"]
        argv += ["--ro-bind", str(ids / "group"), "/etc/group"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        size = str(self.tmp_size)
        argv += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
        argv += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
        # after /tmp: a directory below /tmp (tests, a daemon's work root there) is
        # bound into the private /tmp, not hidden by it; shares first, so that
        # nothing read-only bound after them is made writable through one
        for path in self.share:
            argv += ["--bind-try", str(path), str(path)]
        for path in self.readonly:
            argv += ["--ro-bind", str(path), str(path)]
        argv += ["--bind", str(home), str(home), "--chdir", str(home)]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--"]


def narrowed(paths: Sequence[Path], private: Sequence[Path]) -> tuple[Path, ...]:
    """The real paths among ``paths`` that ``/usr`` does not cover, outermost
    only, leaving out any that would show a ``private`` path (``/`` or one of its
    ancestors, as a python installed beside the daemon's data could be)."""
    kept: list[Path] = []
    hidden = [Path(os.path.realpath(p)) for p in private]
    for path in sorted({Path(os.path.realpath(p)) for p in paths}):
        if path.is_relative_to("/usr") or any(path.is_relative_to(k) for k in kept):
            continue
        if any(h.is_relative_to(path) for h in hidden):
            continue
        if path.exists():
            kept.append(path)
    return tuple(kept)


def identity_files(directory: Path, uid: int, gid: int) -> Path:
    """A directory (``directory/ids-<uid>-<gid>``, in the daemon's own part of the
    work root) holding the ``passwd`` and ``group`` a handler of ``uid``:``gid``
    sees: its own entries and nobody's."""
    target = directory / f"ids-{uid}-{gid}"
    if (target / "group").is_file():
        return target
    target.mkdir(mode=0o755, exist_ok=True)
    os.chmod(target, 0o755)
    entries = {
        "passwd": f"handler:x:{uid}:{gid}:handler:/tmp:/usr/sbin/nologin\n",
        "group": f"handler:x:{gid}:\n",
    }
    for name, text in entries.items():  # group last: its presence says both are whole
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{name}-")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target / name)
    return target

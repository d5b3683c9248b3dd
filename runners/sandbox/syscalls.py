"""The system calls handler processes may not make: a seccomp filter, compiled
with libseccomp (through ``pyseccomp``, a ctypes binding with the API of
libseccomp's own) into a BPF program that bubblewrap loads (``--seccomp``)
right before it starts the handler (``queue_daemon.runners.sandbox.view``).

Every call below is refused with ``EPERM``, not a kill, so a handler can fall
back (``clone3`` gets ``ENOSYS``: its flags sit in memory a filter cannot read,
and C libraries then use ``clone``, whose namespace flags are checked). All
other calls are allowed; a call made through another architecture's entry
(32-bit ``int 0x80`` on x86-64) kills the process, as libseccomp does by
default. ``docs/security.md`` lists the same calls and why.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# why each call is refused, by the docs' groups
REFUSED: dict[str, tuple[str, ...]] = {
    "namespaces (a tenant root of its own user namespace, its own mounts)": (
        "unshare",
        "setns",
    ),
    "mounts": (
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "chroot",
    ),
    "the kernel's least-audited interfaces": (
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "bpf",
        "userfaultfd",
        "perf_event_open",
    ),
    "the kernel keyring": ("keyctl", "add_key", "request_key"),
    "other processes' memory and descriptors": (
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "process_madvise",
        "pidfd_getfd",
        "kcmp",
    ),
    "the kernel itself": (
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "swapoff",
        "syslog",
        "acct",
        "quotactl",
        "quotactl_fd",
        "fanotify_init",
        "lookup_dcookie",
        "uselib",
    ),
    "files by handle (past the view's mounts)": ("open_by_handle_at", "name_to_handle_at"),
}
# clone flags that make a namespace: clone with any of them gets EPERM
NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# personality(2) above PER_LINUX32 is refused: the flags that turn off address
# randomisation (ADDR_NO_RANDOMIZE) or make data executable (READ_IMPLIES_EXEC),
# and with them the query form (0xffffffff)
PERSONALITY_MAX = 0x0008
UNKNOWN = -1  # libseccomp's number of a name it does not know (__NR_SCMP_ERROR)


def refused_calls() -> list[str]:
    """Every call refused outright, in the docs' order."""
    return [name for names in REFUSED.values() for name in names]


def write_filter(path: Path) -> str | None:
    """Compile the filter into ``path`` (0600); None when done, else why not
    (no libseccomp here): handlers then run without a filter (warned)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: no libseccomp
        return f"libseccomp cannot be loaded ({exc})"
    try:
        _write(seccomp, path)
    except OSError as exc:  # a call this libseccomp does not know, a file not written
        return f"the filter cannot be built ({exc})"
    return None


def _write(seccomp: Any, path: Path) -> None:
    refuse = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for name in refused_calls():
        number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        if number == UNKNOWN:
            raise OSError(f"libseccomp does not know {name}: too old")
        if number < 0:
            continue  # not a call of this architecture (libseccomp's pseudo-number)
        rules.add_rule(refuse, name)
    for flag in NAMESPACE_FLAGS.values():
        rules.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(refuse, "personality", seccomp.Arg(0, seccomp.GT, PERSONALITY_MAX))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        rules.export_bpf(out)

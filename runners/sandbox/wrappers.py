"""The exec wrappers a handler process is started through, outermost first.

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
wrappers that need root; only where there is no ``unshare`` does ``subprocess``
switch (``user=``, ``group=``, ``extra_groups=[]``; ``process.start_process``).
When handlers get no network (the default when the daemon is root and
``unshare`` works), that first wrapper also puts the process in a
new network namespace (only a loopback interface of its own: no route to the
host's loopback or anywhere else):

    unshare --net --setgid=G --setuid=U --    (before everything above)

When iproute2's ``ip`` works there, the namespace's loopback is brought up
first (still as root, inside the namespace), so a handler can use 127.0.0.1
within its own tree; the user switch is then a second ``unshare`` without
namespaces:

    unshare --net -- /bin/sh -c '"$1" link set lo up; …; exec "$@"' sh IP
        unshare --setgid=G --setuid=U --

Where bubblewrap's walls stand (``walls``: the usual case), they take the
place of all of the above but the first wrapper: the switch is a plain
``unshare --setgid=G --setuid=U --`` (root only), then ``bwrap …`` as that user
makes the namespaces, the view and the filter, then the wrappers below.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from queue_daemon.runners.sandbox.users import RunAs

# moves the protocol pipes from fds 0/1 to 3/4 (dash only knows fds 0-9 in redirections)
FD_WRAPPER = 'unset PWD OLDPWD; exec 3<&0 4>&1 0</dev/null 1>&2; exec "$@"'
# the first wrapper, as root when the daemon is: makes the process the kernel's
# first choice when memory runs out (``OOM_SCORE_ADJ``; set by root, a handler
# cannot lower it again), enters the cgroups whose cgroup.procs files come
# before ``--``, then becomes the rest
OOM_SCORE_ADJ = 1000
FIRST_WRAPPER = (
    f"unset PWD OLDPWD; echo {OOM_SCORE_ADJ} >/proc/self/oom_score_adj 2>/dev/null;"
    ' while [ "$1" != -- ]; do echo $$ >"$1" || exit 126; shift; done; shift; exec "$@"'
)
# run as root in the new namespaces: brings the loopback up with ip ($1, if any),
# mounts a private tmpfs of $2 bytes on /dev/shm and, when $3 is 1, on /tmp
NAMESPACE_WRAPPER = (
    'unset PWD OLDPWD; if [ -n "$1" ]; then "$1" link set lo up || exit 126; fi;'
    ' if [ -n "$2" ]; then'
    ' mount -t tmpfs -o "size=$2,mode=1777,nosuid,nodev" tmpfs /dev/shm || exit 126;'
    ' if [ "$3" = 1 ]; then'
    ' mount -t tmpfs -o "size=$2,mode=1777,nosuid,nodev" tmpfs /tmp || exit 126; fi; fi;'
    ' shift 3; exec "$@"'
)


def fd_argv() -> list[str]:
    """The wrapper that moves the protocol pipes to fds 3 and 4 (contexts only)."""
    return ["/bin/sh", "-c", FD_WRAPPER, "sh"]


def first_argv(procs: Sequence[Path]) -> list[str]:
    """The first wrapper: ``oom_score_adj``, then the cgroups' ``procs`` files entered."""
    return ["/bin/sh", "-c", FIRST_WRAPPER, "sh", *map(str, procs), "--"]


def user_argv(unshare: str, run_as: RunAs) -> list[str]:
    """util-linux ``unshare`` switching to ``run_as`` (supplementary groups
    cleared), no namespaces; root only."""
    return [unshare, f"--setgid={run_as.gid}", f"--setuid={run_as.uid}", "--"]


def switch_argv(
    run_as: RunAs,
    *,
    switch_user: str,
    unshare: str | None,
    ip: str | None,
    private_mounts: bool,
    private_tmp: bool,
    tmp_size: int,
) -> list[str]:
    """The wrappers that switch to ``run_as`` with util-linux ``unshare`` (root needed:
    after the first wrapper, which writes to root's cgroup files), with ``unshare``
    given first into a network namespace (and IPC and mount namespaces with a
    private /dev/shm, and /tmp if ``private_tmp``, of ``tmp_size`` bytes)."""
    switch = user_argv(unshare or switch_user, run_as)
    if unshare is None:
        return switch
    if ip is None and not private_mounts:
        return [unshare, "--net", *switch[1:]]
    spaces = ["--net"]
    shm = tmp = ""
    if private_mounts:
        spaces += ["--ipc", "--mount", "--propagation", "private"]
        shm, tmp = str(tmp_size), "1" if private_tmp else ""
    inner = ["/bin/sh", "-c", NAMESPACE_WRAPPER, "sh", ip or "", shm, tmp]
    return [unshare, *spaces, "--", *inner, *switch]

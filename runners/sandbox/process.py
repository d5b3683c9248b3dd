"""A handler's process as the daemon holds it: started without a fork of the
daemon, its exit seen at once, its whole tree killed with one call, and how an
exit is described."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from asyncio.unix_events import _UnixSubprocessTransport  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from queue_daemon.runners.pipes import hand_over
from queue_daemon.runners.sandbox.cgroups import CgroupTree


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exit_seen: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exit_seen.done():
            self.exit_seen.set_result(None)


class Child(asyncio.subprocess.Process):
    """A process whose exit is seen at once: ``Process.wait()`` (3.11) also waits for its
    pipes to close, which a leftover grandchild can keep open for ever."""

    _protocol: _Protocol
    _transport: asyncio.SubprocessTransport
    cgroup: Path | None = None  # the cgroup holding its whole tree (runners.sandbox.cgroups)
    # started through bubblewrap (runners.sandbox.walls), which exits 128 + N when
    # the process it runs dies of signal N, as shells report it
    through_walls: bool = False

    @property
    def returncode(self) -> int | None:
        """The exit status, or minus the signal that killed it (behind the walls
        too, where an exit status of 129 to 192 is taken for a death by signal)."""
        code = self._transport.get_returncode()
        if code is not None and self.through_walls and 128 < code <= 128 + 64:
            return 128 - code
        return code

    def kill_tree(self) -> None:
        """SIGKILL its process group and, with a cgroup, every process it ever started."""
        kill_group(self.pid)
        if self.cgroup is not None:
            CgroupTree.kill(self.cgroup)

    async def exited(self) -> int:
        await asyncio.shield(self._protocol.exit_seen)
        returncode = self.returncode
        assert returncode is not None
        return returncode

    def close(self) -> None:
        """Close the pipes (kills the child if it still runs); idempotent."""
        self._transport.close()


async def start_process(argv: list[str], **popen: Any) -> Child:
    """``argv`` started as ``subprocess.Popen`` starts it (``popen``: its keyword
    arguments), its pipes on the running loop.

    Not ``loop.subprocess_exec``: uvloop's forks the daemon, and a fork takes
    time with the daemon's size (12 ms at 80 MiB, 26 ms at 300 MiB, measured),
    all of it on the event loop, where every other tenant's job waits; Popen
    uses vfork, about 2 ms whatever the size (but where it must switch the user
    itself, ``user=``: then it forks too). Its exit is seen through a pidfd on
    the loop (or, without pidfds, a thread that waits for it)."""
    loop = asyncio.get_running_loop()
    protocol = _Protocol(1 << 16, loop)
    waiter = loop.create_future()
    transport = _UnixSubprocessTransport(
        loop, protocol, argv, False, bufsize=0, waiter=waiter, **popen
    )
    watched = False
    try:
        # first: whatever fails after it, the exit of the process the close
        # below kills is seen (the transport's _wait() returns)
        _watch_exit(loop, transport)
        watched = True
        # before its pipes are connected (the transport's next step on the loop);
        # should that step fail, the pipes not yet connected stay open (no
        # close can tell whether the loop took the one that failed)
        hand_over(transport.get_extra_info("subprocess"), loop)
        await waiter
    except BaseException:
        transport.close()  # kills it
        if watched:
            await transport._wait()
        else:  # nothing on the loop sees its exit: reaped here
            await asyncio.to_thread(transport.get_extra_info("subprocess").wait)
        raise
    return Child(transport, protocol, loop)


def _watch_exit(loop: asyncio.AbstractEventLoop, transport: _UnixSubprocessTransport) -> None:
    pid = transport.get_pid()

    def reap(pidfd: int | None = None) -> None:
        """Collect the exit (``pidfd``: of this very process, never a reused pid)."""
        try:
            if pidfd is not None:
                info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
                if info is None:  # not exited after all
                    return
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            else:
                _, status = os.waitpid(pid, os.WNOHANG)
                code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped already: by the transport's close (Popen.poll)
            popen = transport.get_extra_info("subprocess")
            code = 255 if popen is None or popen.returncode is None else popen.returncode
        transport._process_exited(code)

    def wait() -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        loop.call_soon_threadsafe(reap)

    def wait_in_thread() -> None:
        threading.Thread(target=wait, name=f"wait-{pid}", daemon=True).start()

    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # no pidfds here (Linux before 5.3), or no descriptor left
        wait_in_thread()
        return

    def exited() -> None:
        loop.remove_reader(pidfd)
        try:
            reap(pidfd)
        finally:
            os.close(pidfd)

    try:
        loop.add_reader(pidfd, exited)
    except OSError:  # the loop could not watch it (e.g. epoll's max_user_watches reached)
        os.close(pidfd)
        wait_in_thread()
    except BaseException:
        os.close(pidfd)
        raise


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group (a handler's whole tree); quiet if it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"

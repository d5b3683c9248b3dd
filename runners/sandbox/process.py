"""A handler's process as the daemon holds it: its exit seen at once, its whole tree
killed with one call, and how an exit is described."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

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

"""A context's process and what it leaves: its private directory, its
held-results file (``runners.held``) and the drain of its stdout and stderr
into a ring of recent lines (a full pipe would block it), which explains a
crash. Started, stopped, explained and cleaned up here; the protocol spoken
with it is ``runners.context``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from queue_daemon.runners import framing
from queue_daemon.runners.budget import Spend
from queue_daemon.runners.errors import ContextFailed
from queue_daemon.runners.held import HeldFile
from queue_daemon.runners.ring import LineRing, drain, finish_reading
from queue_daemon.runners.sandbox import Child, Sandbox, describe_exit

logger = logging.getLogger(__name__)

STDERR_TAIL = 5  # lines of stderr quoted when a context dies
EXIT_GRACE = 1.0  # seconds a context gets to leave after ``exit``
DRAIN_GRACE = 1.0  # seconds to read what a dead context last wrote


class ContextChild:
    """One context's process in ``sandbox`` for ``client``'s handlers."""

    def __init__(self, sandbox: Sandbox, client: str, spend: Spend) -> None:
        self.output = LineRing()  # the child's stdout and stderr (context-level, not a job's)
        self.proc: Child | None = None
        self.home: Path | None = None
        self.held: HeldFile | None = None
        self._sandbox = sandbox
        self._client = client
        self._spend = spend  # the tenant's output budget (runners.budget)
        self._drains: list[asyncio.Task[None]] = []

    async def spawn(
        self, command: list[str], memory: str, lang: str
    ) -> tuple[framing.FrameReader, asyncio.StreamWriter, asyncio.ReadTransport]:
        """Start the child in a new private directory, its protocol pipes as fds 3
        and 4: the frames read from it and written to it; ContextFailed if it
        cannot start."""
        await self._sandbox.prepare()
        self.home = home = self._sandbox.make_dir(f"ctx-{self._client}-", self._client)
        owner = self._sandbox.owner(self._client)
        self.held = HeldFile.create(home, None if owner is None else (owner.uid, owner.gid))
        to_child, to_daemon = os.pipe(), os.pipe()
        try:
            self.proc = proc = await self._sandbox.spawn(
                command,
                client=self._client,
                home=home,
                pipes=(to_child[0], to_daemon[1]),
                memory=memory,
            )
        except OSError as exc:
            for fd in (*to_child, *to_daemon):
                os.close(fd)
            raise ContextFailed(f"cannot start a {lang} context: {exc}") from None
        os.close(to_child[0])
        os.close(to_daemon[1])
        pipes = await framing.open_pipes(to_daemon[0], to_child[1])
        assert proc.stderr is not None
        self._drains = [
            asyncio.create_task(
                drain(proc.stderr, self.output, self._spend), name=f"ctx-{proc.pid}-output"
            )
        ]
        return pipes

    def kill_tree(self) -> None:
        if self.proc is not None:
            self.proc.kill_tree()

    async def stop(self) -> None:
        """Kill the whole tree and reap the child."""
        if self.proc is None:
            return
        self.proc.kill_tree()
        await self.proc.exited()

    async def death(self, what: str) -> str:
        """Why the child died: its exit status and the last lines it wrote to stderr."""
        await self.stop()
        await self._finish_drains()
        assert self.proc is not None
        text = f"{what} ({describe_exit(self.proc.returncode)})"
        tail = [line for line in self.output.tail(STDERR_TAIL) if line.strip()]
        return f"{text}: " + " | ".join(tail) if tail else text

    async def end(self, writer: asyncio.StreamWriter | None) -> None:
        """Ask the child to exit (through ``writer``, when it may still be asked),
        kill its group after a grace period (and whatever it left behind in its
        group and cgroup), reap it."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None and writer is not None:
            with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
                writer.write(framing.encode({"op": "exit"}))
                await asyncio.wait_for(proc.exited(), EXIT_GRACE)
        proc.kill_tree()
        await proc.exited()
        await self._sandbox.release(proc)

    async def clean(self) -> None:
        """Once it ended and its pipes are closed: read what it last wrote, then
        free its process handle, its held-results file and its directory."""
        await self._finish_drains()
        if self.proc is not None:
            self.proc.close()
        if self.held is not None:
            self.held.close()
        if self.home is not None:
            await asyncio.to_thread(self._sandbox.remove_dir, self.home)

    async def _finish_drains(self) -> None:
        drains, self._drains = self._drains, []
        for failure in await finish_reading(drains, DRAIN_GRACE):
            logger.warning("draining a context's output failed: %r", failure)

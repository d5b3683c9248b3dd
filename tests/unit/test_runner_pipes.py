"""A context's pipes and a handler process's stderr pipe are closed exactly
once on either event loop (``runners.pipes``): uvloop's transports close their
descriptor and then the file object they were given (MagicStack/uvloop#763)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import io
import os
import subprocess
import sys
from collections.abc import Callable
from typing import ClassVar

import pytest
import uvloop

from queue_daemon.runners import framing, pipes
from queue_daemon.runners.sandbox import process
from queue_daemon.runners.sandbox.process import start_process

LOOPS = pytest.mark.parametrize(
    "new_loop", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"]
)


class WatchedPipe(io.FileIO):
    """A context's pipe file that, when closed after its descriptor was closed
    already (by another owner), first takes the freed number as another thread
    or the loop could: what its own close then does to that number shows."""

    taken: ClassVar[list[int]] = []

    def close(self) -> None:
        if not self.closed:
            try:
                os.fstat(self.fileno())
            except OSError:  # freed: a new pipe gets the number
                WatchedPipe.taken += os.pipe()
        super().close()


def _close_what_took_freed_numbers() -> None:
    """The pipes a WatchedPipe opened on freed numbers, closed: each must still
    be open (no second close of the number reached it)."""
    for fd in WatchedPipe.taken:
        os.fstat(fd)
        os.close(fd)


@LOOPS
def test_a_context_pipe_is_closed_once_on_either_loop(
    new_loop: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop's pipe transports close their descriptor and then their file
    object: were that an owner too, its close would close whatever took the
    number in between (MagicStack/uvloop#763)."""
    monkeypatch.setattr(pipes, "PIPE_FILE", WatchedPipe)
    monkeypatch.setattr(WatchedPipe, "taken", [])
    to_daemon, to_child = os.pipe(), os.pipe()
    ours = [os.fstat(to_daemon[0]).st_ino, os.fstat(to_child[1]).st_ino]

    async def a_context() -> None:
        reader, writer, read_transport = await framing.open_pipes(to_daemon[0], to_child[1])
        writer.write(framing.encode({"op": "batch"}))
        await writer.drain()
        assert framing.decode(os.read(to_child[0], 1 << 16)[4:]) == {"op": "batch"}
        os.write(to_daemon[1], framing.encode({"op": "done"}))
        assert await reader.read() == {"op": "done"}
        read_transport.close()
        writer.close()
        await asyncio.sleep(0.05)  # their connection_lost callbacks

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(a_context())
    gc.collect()
    _close_what_took_freed_numbers()
    for fd, inode in zip((to_daemon[0], to_child[1]), ours, strict=True):
        with contextlib.suppress(OSError):  # closed, or another file's by now
            assert os.fstat(fd).st_ino != inode, "a pipe end was left open"
    for fd in (to_daemon[1], to_child[0]):
        os.close(fd)


@LOOPS
def test_a_handler_process_stderr_pipe_is_closed_once_on_either_loop(
    new_loop: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipes, "PIPE_FILE", WatchedPipe)
    monkeypatch.setattr(WatchedPipe, "taken", [])
    new_loop().close()  # (uvloop keeps a pipe of its own from its first loop on)
    before = set(os.listdir("/proc/self/fd"))

    async def a_process() -> bytes:
        child = await start_process(
            [sys.executable, "-c", "import sys; sys.stderr.write('said')"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert child.stderr is not None
        said = await child.stderr.read()
        await child.exited()
        child._transport.close()
        await asyncio.sleep(0.05)  # the pipe transport's connection_lost
        return said

    with asyncio.Runner(loop_factory=new_loop) as runner:
        assert runner.run(a_process()) == b"said"
    gc.collect()
    _close_what_took_freed_numbers()
    if new_loop is uvloop.new_event_loop:
        assert WatchedPipe.taken, "the stderr pipe was not handed over"
    assert set(os.listdir("/proc/self/fd")) <= before  # none left open


@LOOPS
def test_a_process_whose_pipes_cannot_be_handed_over_is_stopped_and_reaped(
    new_loop: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors while its pipes are handed over (EMFILE), the start
    fails at once, and the process it started is killed and reaped."""
    started: list[int] = []

    def no_descriptor_left(popen: subprocess.Popen[bytes], loop: object) -> None:
        started.append(popen.pid)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(process, "hand_over", no_descriptor_left)

    async def a_start() -> None:
        async with asyncio.timeout(10):
            await start_process(
                ["sleep", "60"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )

    with asyncio.Runner(loop_factory=new_loop) as runner, pytest.raises(OSError) as failed:
        runner.run(a_start())
    assert failed.value.errno == errno.EMFILE  # not the timeout: the start did not hang
    assert len(started) == 1
    assert not os.path.exists(f"/proc/{started[0]}")  # killed and reaped (no zombie)


@LOOPS
def test_a_process_exit_is_seen_when_the_loop_cannot_watch_its_pidfd(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """The loop refuses the pidfd (epoll full): a thread waits for the exit instead."""

    async def a_process() -> int:
        loop = asyncio.get_running_loop()
        add_reader = loop.add_reader

        def refuse(fd: int, callback: Callable[..., object], *args: object) -> None:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]":
                raise OSError(errno.ENOSPC, "No space left on device")
            add_reader(fd, callback, *args)

        loop.add_reader = refuse  # type: ignore[method-assign,assignment]
        async with asyncio.timeout(10):
            child = await start_process(
                [sys.executable, "-c", "raise SystemExit(3)"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            return await child.exited()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        assert runner.run(a_process()) == 3

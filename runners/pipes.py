"""Pipe descriptors handed to the event loop's pipe transports (a context's
frames, a handler process's stderr), each closed exactly once on either loop.

uvloop's pipe transports close their descriptor themselves (libuv owns the
number it was given), and then close the file object they were given as well:
a file object that owned the number would close it a second time, by then
perhaps another file's or socket's, opened in between by a thread or by the
loop (a journal segment, a tenant's connection, another context's pipe;
MagicStack/uvloop#763). So under uvloop the file objects handed over do not
own their descriptor; under asyncio's own loop they do, and its transports
close them.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from typing import Any

# The file objects' class (a test puts one in its place that watches its close).
PIPE_FILE = io.FileIO
MODES = (("stdin", "wb"), ("stdout", "rb"), ("stderr", "rb"))  # a Popen's pipes


def loop_closes_pipes(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``'s pipe transports close their descriptor themselves:
    uvloop's loops (and their subclasses); not loaded, none is one."""
    uvloop = sys.modules.get("uvloop.loop")
    return uvloop is not None and isinstance(loop, uvloop.Loop)


def pipe_file(fd: int, mode: str, loop: asyncio.AbstractEventLoop) -> io.FileIO:
    """An unbuffered file object for ``fd`` (then owned here), for ``loop``'s
    ``connect_read_pipe`` (``mode`` "rb") or ``connect_write_pipe`` ("wb")."""
    return PIPE_FILE(fd, mode[0], closefd=not loop_closes_pipes(loop))


def hand_over(popen: subprocess.Popen[Any], loop: asyncio.AbstractEventLoop) -> None:
    """A new process's pipes (``stdin``, ``stdout``, ``stderr``, as ``Popen``
    made them), before asyncio's subprocess transport connects them to
    ``loop``: on a loop whose transports close their descriptor, each becomes
    a descriptor of its own that no file object closes (its original closed
    here, once)."""
    if not loop_closes_pipes(loop):
        return
    pipes = [
        (name, mode, pipe) for name, mode in MODES if (pipe := getattr(popen, name)) is not None
    ]
    dups: list[int] = []
    # every one or none: out of descriptors (EMFILE), none is swapped and the
    # process is stopped (pipes the loop still connects may be closed twice)
    try:
        for _, _, pipe in pipes:
            dups.append(os.dup(pipe.fileno()))
    except OSError:
        for fd in dups:
            os.close(fd)
        raise
    for (name, mode, pipe), fd in zip(pipes, dups, strict=True):
        pipe.close()
        setattr(popen, name, pipe_file(fd, mode, loop))

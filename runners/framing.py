"""Frames of runners/PROTOCOL.md: a 4-byte big-endian length, then that many bytes of JSON."""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from queue_daemon.runners.errors import FrameTooLarge, ProtocolError
from queue_daemon.runners.models import JobInput
from queue_daemon.runners.pipes import pipe_file

MAX_FRAME = 64 << 20
HEADER = struct.Struct(">I")
READ_SIZE = 1 << 18


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message``; FrameTooLarge over MAX_FRAME."""
    data = orjson.dumps(message)
    if len(data) > MAX_FRAME:
        raise FrameTooLarge(f"frame of {len(data)} bytes is over the {MAX_FRAME} byte limit")
    return HEADER.pack(len(data)) + data


def batch_frames(
    jobs: Sequence[JobInput], emit_limit: int | None, type: str, emit_batch: int | None = None
) -> list[tuple[bytes, Sequence[JobInput]]]:
    """``batch`` frames of at most ``MAX_FRAME`` (a batch of big payloads is split),
    for the handler of ``type``; each with the jobs it holds. ``emit_limit``:
    bytes of follow-on payloads each job may send; ``emit_batch``: all its jobs
    together (each frame's, when it is split)."""
    items: list[dict[str, object]] = [
        {"id": j.id, "payload": j.payload, "attempt": j.attempt} for j in jobs
    ]
    if any(j.traceparent is not None for j in jobs):  # the daemon traces (observe.tracing)
        for item, job in zip(items, jobs, strict=True):
            if job.traceparent is not None:
                item["traceparent"] = job.traceparent
    message: dict[str, object] = {"op": "batch", "type": type, "jobs": items}
    if emit_limit is not None:
        message["emit"] = emit_limit
    if emit_batch is not None:
        message["emit_batch"] = emit_batch
    try:
        return [(encode(message), jobs)]
    except FrameTooLarge:
        if len(jobs) == 1:
            raise
    half = len(jobs) // 2
    return batch_frames(jobs[:half], emit_limit, type, emit_batch) + batch_frames(
        jobs[half:], emit_limit, type, emit_batch
    )


def decode(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The message of a frame's body; ProtocolError when it is not a JSON object."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def split(buffer: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """Every complete frame at the start of ``buffer``, and the incomplete rest."""
    messages = []
    view = memoryview(buffer)
    offset = 0
    while len(view) - offset >= HEADER.size:
        (size,) = HEADER.unpack_from(view, offset)
        if size > MAX_FRAME:
            raise FrameTooLarge(f"frame of {size} bytes announced, limit {MAX_FRAME}")
        end = offset + HEADER.size + size
        if end > len(view):
            break
        messages.append(decode(bytes(view[offset + HEADER.size : end])))
        offset = end
    return messages, bytes(view[offset:])


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at end of stream on a frame boundary.

    ProtocolError for a torn frame (end of stream inside it), an oversized
    announcement or a body that is not a JSON object.
    """
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError("end of stream inside a frame header") from None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameTooLarge(f"frame of {size} bytes announced, limit {MAX_FRAME}")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ProtocolError(f"end of stream inside a frame of {size} bytes") from None
    return decode(body)


class FrameReader:
    """Messages from a StreamReader, many frames parsed per read (the daemon's side).

    ``read()`` returns the next message, None at end of stream on a frame
    boundary, and raises ProtocolError for a torn or oversized frame or a body
    that is not a JSON object.
    """

    __slots__ = ("_buffer", "_ready", "_stream", "on_end")

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._ready: deque[dict[str, Any]] = deque()
        # called once when the stream ends: messages to read after it (runners.held)
        self.on_end: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None

    async def read(self) -> dict[str, Any] | None:
        ready = self._ready
        while not ready:
            data = await self._stream.read(READ_SIZE)
            if not data:
                if self._buffer:
                    raise ProtocolError(f"end of stream inside a frame ({len(self._buffer)} bytes)")
                on_end, self.on_end = self.on_end, None
                if on_end is None:
                    return None
                ready.extend(await on_end())
                return ready.popleft() if ready else None
            self._buffer += data
            self._parse()
        return ready.popleft()

    def _parse(self) -> None:
        buffer = self._buffer
        size = len(buffer)
        offset = 0
        while size - offset >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, offset)
            if length > MAX_FRAME:
                raise FrameTooLarge(f"frame of {length} bytes announced, limit {MAX_FRAME}")
            end = offset + HEADER.size + length
            if end > size:
                break
            with memoryview(buffer) as view:  # no copy of a big frame
                self._ready.append(decode(view[offset + HEADER.size : end]))
            offset = end
        if offset == size and size > READ_SIZE:
            self._buffer = bytearray()  # a big frame's room is given back
        elif offset:
            del buffer[:offset]


async def open_pipes(
    read_fd: int, write_fd: int
) -> tuple[FrameReader, asyncio.StreamWriter, asyncio.ReadTransport]:
    """Frames read from ``read_fd`` and written to ``write_fd`` (both then owned
    here), on the running loop; and the read transport, to close."""
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=1 << 20)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stream), pipe_file(read_fd, "rb", loop)
    )
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe_file(write_fd, "wb", loop))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return FrameReader(stream), writer, read_transport

"""The python context's side of the frames of runners/PROTOCOL.md: reading the
daemon's, writing results (the common one without json's encoder), and
holding the results of quick jobs to write them a group at a time.

A module of the bootstrap (``python_boot.py`` imports it from its own
directory): stdlib only, never the project.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing is not imported at run time: start-up time
if TYPE_CHECKING:
    from typing import Any

    Message = dict[str, Any]

IN_FD = 3
OUT_FD = 4
MAX_FRAME = 64 << 20

to_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


def frame(message: Message) -> bytes:
    # lone surrogates cannot be UTF-8: they become "?"
    data = to_json(message).encode("utf-8", "replace")
    if len(data) > MAX_FRAME:
        raise OverflowError("frame over 64 MiB")
    return len(data).to_bytes(4, "big") + data


def write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(OUT_FD, view) :]


class Held:
    """Results of quick jobs, written a group at a time (PROTOCOL.md, "Held
    results"): a write per job costs a quick job more than the job. The group
    not yet sent is kept in the daemon's file (mapped: no call per job), which
    it reads back if the context dies with one unsent."""

    SIZE = 64 << 10  # the file's size: 4 bytes of length, then the frames held
    MOST = 64  # results held at most
    WAIT = 0.001  # seconds the first result held waits at most (as later jobs end)
    QUICK = 0.0005  # results are held while the handler's jobs take less (on average)

    def __init__(self) -> None:
        self.map: Any = None
        self.used = 4
        self.count = 0
        self.since = 0.0
        try:
            fd = os.open(".qd-held", os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            return  # none made for this context: each result is written as it comes
        try:
            import mmap

            if os.fstat(fd).st_size >= self.SIZE:
                self.map = mmap.mmap(fd, self.SIZE)
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)

    def add(self, data: bytes, now: float) -> None:
        """Hold ``data`` (a result frame), or write it now with the group."""
        end = self.used + len(data)
        if end > self.SIZE:
            self.flush(data)
            return
        self.map[self.used : end] = data
        self.map[0:4] = (end - 4).to_bytes(4, "little")
        if not self.count:
            self.since = now
        self.used = end
        self.count += 1
        if self.count >= self.MOST or now - self.since >= self.WAIT:
            self.flush()

    def flush(self, more: bytes = b"") -> None:
        """Write what is held, then ``more``."""
        if self.count:
            write(self.map[4 : self.used] + more)
            self.map[0:4] = bytes(4)
            self.used = 4
            self.count = 0
        elif more:
            write(more)


HELD = Held()  # in the context's directory, its working directory


class Reader:
    def __init__(self, fd: int) -> None:
        self.file = open(fd, "rb", buffering=1 << 16, closefd=False)  # noqa: SIM115

    def frame(self) -> Message | None:
        header = self.file.read(4)
        if len(header) < 4:
            return None
        size = int.from_bytes(header, "big")
        if size > MAX_FRAME:
            raise OverflowError("frame over 64 MiB")
        body = self.file.read(size)
        if len(body) < size:
            return None
        message: Message = _loads(body)
        return message


def plain_result_frame(job_id: str, code: int, result: str | None, ms: float) -> bytes:
    """The common result (no output, no follow-on job), written without the
    encoder's walk of a dict (a third of a no-op job's time here); its id and
    result escaped as ``frame`` escapes them. OverflowError over 64 MiB;
    ValueError for an exit code too long to print."""
    text = "null" if result is None else to_json(result)
    data = (
        f'{{"op":"result","id":{to_json(job_id)},"exitcode":{code},"result":{text},"ms":{ms:.3f}}}'
    )
    body = data.encode("utf-8", "replace")
    if len(body) > MAX_FRAME:
        raise OverflowError("frame over 64 MiB")
    return len(body).to_bytes(4, "big") + body


def result_frame(message: Message, ms: float) -> bytes:
    """The frame of a job's ``result`` message, with its run's time (``ms``)."""
    code = message["exitcode"]
    try:
        plain = len(message) == 6 and not message["output"] and not message["emits"]
        if plain and type(code) is int:  # (not a bool)
            return plain_result_frame(message["id"], code, message["result"], ms)
        message["ms"] = round(ms, 3)
        return frame(message)
    except (OverflowError, TypeError, ValueError) as exc:
        size = len(message.get("output") or "")
        return frame(
            {
                "op": "result",
                "id": message["id"],
                "exitcode": 500,
                "result": f"the job's result and output do not fit in a frame: {exc}",
                "output": f"(output of {size} characters dropped)",
                "emits": [],
                "ms": round(ms, 3),
            }
        )

"""An add's options that travel with its jobs through the journal (after the
dt field of each line, ``queue_daemon.journal.format``): the jobs they wait
for, how those must end, a deadline, a priority, a concurrency key and a
trace. Adds
without options write none, so the common line and its parsing are as they were.

``a<id>,<id>…`` the dependencies; ``r`` all-resolved (default all-completed);
``d<epoch ms>`` the deadline; ``p<integer>`` the priority (0 is written as
nothing); ``k<hex>`` the key, its UTF-8 in hex digits (a key may hold any
printable character, ``;`` and ``|`` too); ``t<traceparent>`` the trace (a W3C
traceparent, observe.tracing); joined by ``;``. Ids hold no ``;``, ``,`` or ``|``
(``ID_RE``); unknown parts are ignored, so an older daemon's lines still read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
MAX_AFTER = 100  # dependencies per job
PRIORITIES = range(-100, 101)  # a job's priority: higher runs first, 0 by default
_PRIORITY = re.compile(r"p-?[0-9]{1,4}")
_TRACE = re.compile(r"t00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_KEY = 200  # characters of a concurrency key


def valid_key(key: str) -> bool:
    """1 to MAX_KEY printable characters (no control character, no lone surrogate)."""
    if not 1 <= len(key) <= MAX_KEY or not key.isprintable():
        return False
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class JobOptions:
    after: tuple[str, ...] = ()
    resolve_any: bool = False  # all-resolved: any outcome of a dependency counts
    deadline_ms: int | None = None
    priority: int = 0
    key: str | None = None
    trace: str | None = None  # the add's span (a W3C traceparent), when traced

    def __bool__(self) -> bool:
        return (
            bool(self.after)
            or self.deadline_ms is not None
            or self.priority != 0
            or self.key is not None
            or self.trace is not None
        )

    def encode(self) -> str:
        parts = []
        if self.after:
            parts.append("a" + ",".join(self.after))
            if self.resolve_any:
                parts.append("r")
        if self.deadline_ms is not None:
            parts.append(f"d{self.deadline_ms:d}")
        if self.priority:
            parts.append(f"p{self.priority:d}")
        if self.key is not None:
            parts.append("k" + self.key.encode("utf-8").hex())
        if self.trace is not None:
            parts.append("t" + self.trace)
        return ";".join(parts)

    @classmethod
    def parse(cls, text: str) -> JobOptions:
        after: tuple[str, ...] = ()
        resolve_any = False
        deadline: int | None = None
        priority = 0
        key: str | None = None
        trace: str | None = None
        for part in text.split(";"):
            if part.startswith("a"):
                after = tuple(i for i in part[1:].split(",") if i)
            elif part == "r":
                resolve_any = True
            elif part.startswith("d") and part[1:].isdigit():
                deadline = int(part[1:])
            elif _PRIORITY.fullmatch(part):
                priority = max(PRIORITIES.start, min(PRIORITIES.stop - 1, int(part[1:])))
            elif part.startswith("k"):
                key = _key(part[1:])
            elif _TRACE.fullmatch(part):
                trace = part[1:]
        return cls(after, resolve_any, deadline, priority, key, trace)


def _key(text: str) -> str | None:
    try:
        key = bytes.fromhex(text).decode("utf-8")
    except ValueError:  # not hex, or not UTF-8 (UnicodeDecodeError is one)
        return None
    return key if valid_key(key) else None


NO_OPTIONS = JobOptions()  # an add without options: nearly every one

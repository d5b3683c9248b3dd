"""An add's options that travel with its jobs through the journal (after the
dt field of each line, ``queue_daemon.journal.format``): the jobs they wait for, how those
must end, and a deadline. Adds without options write none, so the common
line and its parsing are as they were.

``a<id>,<id>…`` the dependencies; ``r`` all-resolved (default all-completed);
``d<epoch ms>`` the deadline; joined by ``;``. Ids hold no ``;``, ``,`` or ``|``
(``ID_RE``); unknown parts are ignored, so an older daemon's lines still read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
MAX_AFTER = 100  # dependencies per job


@dataclass(frozen=True, slots=True)
class JobOptions:
    after: tuple[str, ...] = ()
    resolve_any: bool = False  # all-resolved: any outcome of a dependency counts
    deadline_ms: int | None = None

    def __bool__(self) -> bool:
        return bool(self.after) or self.deadline_ms is not None

    def encode(self) -> str:
        parts = []
        if self.after:
            parts.append("a" + ",".join(self.after))
            if self.resolve_any:
                parts.append("r")
        if self.deadline_ms is not None:
            parts.append(f"d{self.deadline_ms:d}")
        return ";".join(parts)

    @classmethod
    def parse(cls, text: str) -> JobOptions:
        after: tuple[str, ...] = ()
        resolve_any = False
        deadline: int | None = None
        for part in text.split(";"):
            if part.startswith("a"):
                after = tuple(i for i in part[1:].split(",") if i)
            elif part == "r":
                resolve_any = True
            elif part.startswith("d") and part[1:].isdigit():
                deadline = int(part[1:])
        return cls(after, resolve_any, deadline)


NO_OPTIONS = JobOptions()  # an add without options: nearly every one

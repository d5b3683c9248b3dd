"""An add's options that travel with its jobs through the journal (after the
dt field of each line, ``queue_daemon.journal.format``): the jobs they wait for, how those
must end, a deadline and a priority. Adds without options write none, so the common
line and its parsing are as they were.

``a<id>,<id>…`` the dependencies; ``r`` all-resolved (default all-completed);
``d<epoch ms>`` the deadline; ``p<integer>`` the priority (0 is written as
nothing); joined by ``;``. Ids hold no ``;``, ``,`` or ``|``
(``ID_RE``); unknown parts are ignored, so an older daemon's lines still read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
MAX_AFTER = 100  # dependencies per job
PRIORITIES = range(-100, 101)  # a job's priority: higher runs first, 0 by default
_PRIORITY = re.compile(r"p-?[0-9]{1,4}")


@dataclass(frozen=True, slots=True)
class JobOptions:
    after: tuple[str, ...] = ()
    resolve_any: bool = False  # all-resolved: any outcome of a dependency counts
    deadline_ms: int | None = None
    priority: int = 0

    def __bool__(self) -> bool:
        return bool(self.after) or self.deadline_ms is not None or self.priority != 0

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
        return ";".join(parts)

    @classmethod
    def parse(cls, text: str) -> JobOptions:
        after: tuple[str, ...] = ()
        resolve_any = False
        deadline: int | None = None
        priority = 0
        for part in text.split(";"):
            if part.startswith("a"):
                after = tuple(i for i in part[1:].split(",") if i)
            elif part == "r":
                resolve_any = True
            elif part.startswith("d") and part[1:].isdigit():
                deadline = int(part[1:])
            elif _PRIORITY.fullmatch(part):
                priority = max(PRIORITIES.start, min(PRIORITIES.stop - 1, int(part[1:])))
        return cls(after, resolve_any, deadline, priority)


NO_OPTIONS = JobOptions()  # an add without options: nearly every one

"""The ``ctx`` a python handler gets (runners/PROTOCOL.md): its job's id, attempt,
type and client, and ``emit``, bounded by the run's emit limit and the batch's
shared emit budget. Standalone and stdlib only, beside ``python_boot.py``."""

from __future__ import annotations

from math import isfinite
from threading import current_thread, main_thread
from time import monotonic

from python_frames import frame, to_json, write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Message = dict[str, Any]

JOB_COST = 65536  # bytes of the batch's emit budget a follow-on job costs beyond its payload
PROGRESS_EVERY = 0.1  # seconds between progress frames of a job; the last one is kept
MAX_MESSAGE = 200  # characters of a progress message sent


class Ctx:
    """The ``ctx`` a handler gets: id, attempt, type, traceparent, emit(type,
    payload), progress(fraction, message). Its
    ``emit`` calls are kept up to ``limit`` bytes of payloads (the daemon's emit
    limit for the tenant) and while the batch's ``budget`` (a one-item list its
    jobs share, or None) lasts, each payload costing it its bytes and 64 KiB
    more (a job, as the add rate counts it); the ones past either are counted,
    not kept (``_short``: past the budget only). A job short of the budget runs
    again: what it took is given back, and its later calls take nothing."""

    __slots__ = (
        "_budget",
        "_cost",
        "_over",
        "_pairs",
        "_progress",
        "_room",
        "_sent",
        "_short",
        "_taken",
        "attempt",
        "client",
        "id",
        "traceparent",
        "type",
    )

    def __init__(
        self,
        job: Message,
        type_: str,
        client: str,
        limit: int | None,
        budget: list[int] | None = None,
    ) -> None:
        self.id = job["id"]
        self.attempt = job.get("attempt", 1)
        # the W3C traceparent of this run's span when the daemon traces, else None
        self.traceparent = job.get("traceparent")
        self.type = type_
        self.client = client
        self._pairs: list[list[str]] = []
        self._room = limit
        self._budget = budget
        self._over = 0
        self._short = 0
        self._taken = 0  # of the budget
        self._cost = 0  # of all its calls, kept or not
        self._progress: list[Any] | None = None  # the last report not sent yet
        self._sent = 0.0  # when the last progress frame was written

    def emit(self, type: str, payload: Any) -> None:
        if not isinstance(type, str):
            raise TypeError("ctx.emit: type must be a string")
        if not isinstance(payload, str):
            payload = to_json(payload)
        if self._room is not None or self._budget is not None:
            size = len(payload) if payload.isascii() else len(payload.encode("utf-8", "replace"))
            if self._room is not None and size > self._room:
                self._over += 1
                return
            budget = self._budget
            if budget is not None:
                cost = size + JOB_COST
                self._cost += cost
                if self._short or cost > budget[0]:
                    self._over += 1
                    self._short += 1  # the daemon runs it again if it could ever fit
                    budget[0] += self._taken
                    self._taken = 0
                    return
                budget[0] -= cost
                self._taken += cost
            if self._room is not None:
                self._room -= size
        self._pairs.append([type, payload])

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the job is (0 to 1) and what it does: shown by a GET of
        the job while it runs, the last one kept. Frequent calls are cheap: at
        most one report every 0.1 s leaves, the last one always does."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise TypeError("ctx.progress: fraction must be a number from 0 to 1")
        if not isfinite(fraction):
            raise ValueError("ctx.progress: fraction must be a number from 0 to 1")
        if not isinstance(message, str):
            raise TypeError("ctx.progress: message must be a string")
        report = [min(1.0, max(0.0, float(fraction))), message[:MAX_MESSAGE]]
        now = monotonic()
        if now - self._sent < PROGRESS_EVERY or current_thread() is not main_thread():
            # sent with the result, unless a later one leaves first; another
            # thread never writes: its frame could land inside a result's
            self._progress = report
            return
        self._sent, self._progress = now, None
        write(frame({"op": "progress", "id": self.id, "fraction": report[0], "message": report[1]}))

    def __repr__(self) -> str:
        return f"<ctx id={self.id!r} attempt={self.attempt!r} type={self.type!r}>"

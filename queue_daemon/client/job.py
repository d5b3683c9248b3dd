"""A claimed job as a ``Worker``'s function gets it, and what its return value means."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import orjson


class Job:
    """A claimed job, as the worker's function gets it."""

    __slots__ = (
        "_cancelled",
        "_emits",
        "_lease_end",
        "_progress",
        "attempts",
        "claim",
        "id",
        "key",
        "lease_until",
        "payload",
        "traceparent",
        "type",
    )

    def __init__(self, item: dict[str, Any], lease_end: float | None = None) -> None:
        self.id: str = item["id"]
        self.type: str = item["type"]
        self.payload: str = item["payload"]
        self.attempts: int = item["attempts"]
        self.key: str | None = item.get("key")  # its concurrency key, if it has one
        # its claim's span (W3C) when the daemon traces: the parent of the worker's own
        self.traceparent: str | None = item.get("traceparent")
        self.lease_until: str = item["lease_until"]
        self.claim: str = item["claim"]
        self._emits: list[dict[str, Any]] = []
        self._progress: dict[str, Any] | None = None  # sent with the next renewal
        self._cancelled = False  # cancelled while held: its outcome is not sent
        # moved on by each renewal; given when the claim's jobs share one lease
        self._lease_end = epoch(self.lease_until) if lease_end is None else lease_end

    @property
    def attempt(self) -> int:
        """The number of this run (1 for the first)."""
        return self.attempts

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return orjson.loads(self.payload)

    def emit(self, type: str, payload: Any) -> None:
        """Add a follow-on job of this tenant when this one completes (a string,
        or any JSON value)."""
        self._emits.append({"type": type, "payload": payload})

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the job is (0 to 1) and what it does: sent with the
        claim's next renewal (every third of its lease), shown by a GET of the job."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise TypeError("progress: fraction must be a number from 0 to 1")
        if not 0 <= fraction <= 1:
            raise ValueError("progress: fraction must be a number from 0 to 1")
        if not isinstance(message, str):
            raise TypeError("progress: message must be a string")
        self._progress = {"fraction": float(fraction), "message": message[:200]}

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.type} attempt {self.attempts}>"


def jobs_of(items: list[dict[str, Any]]) -> list[Job]:
    """The jobs of a claim's items, the end of each distinct lease parsed once (a
    claim's jobs share one)."""
    ends: dict[Any, float] = {}
    jobs = []
    for item in items:
        until = item["lease_until"]
        end = ends.get(until)
        if end is None:
            end = ends[until] = epoch(until)
        jobs.append(Job(item, end))
    return jobs


def outcome(value: Any) -> tuple[int, Any]:
    """(exitcode, result) of what the function returned: None is 200; an int is
    the exitcode; a string the result (200); a pair ``(exitcode, result)``; any
    other value a JSON result (200)."""
    if value is None:
        return 200, None
    if isinstance(value, bool):
        return 200, value
    if isinstance(value, int):
        return value, None
    if isinstance(value, str):
        return 200, value
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and isinstance(value[0], int)
        and not isinstance(value[0], bool)
    ):
        return value[0], value[1]
    return 200, value


def failure(exc: BaseException) -> tuple[int, str]:
    return 500, f"{type(exc).__name__}: {exc}"


def sendable(item: dict[str, Any]) -> dict[str, Any]:
    """``item``, or a 500 complete of its job when its result or follow-on jobs
    cannot be sent as JSON."""
    try:
        orjson.dumps(item)
    except TypeError as exc:
        result = f"the result or a follow-on job is not JSON: {exc}"
        return {"id": item["id"], "claim": item["claim"], "exitcode": 500, "result": result}
    return item


def epoch(iso: str | None) -> float:
    """Seconds since the epoch of an ISO-8601 time (a minute from now if it is not one)."""
    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time() + 60.0


def lease_seconds(job: Job) -> float:
    return max(1.0, job._lease_end - time.time())

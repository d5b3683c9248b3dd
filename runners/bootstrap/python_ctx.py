"""The ``ctx`` a python handler gets (runners/PROTOCOL.md): its job's id, attempt,
type and client, and ``emit``, bounded by the run's emit limit and the batch's
shared emit budget. Standalone and stdlib only, beside ``python_boot.py``."""

from __future__ import annotations

from python_frames import to_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Message = dict[str, Any]

JOB_COST = 65536  # bytes of the batch's emit budget a follow-on job costs beyond its payload


class Ctx:
    """The ``ctx`` a handler gets: id, attempt, type, emit(type, payload). Its
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
        "_room",
        "_short",
        "_taken",
        "attempt",
        "client",
        "id",
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
        self.type = type_
        self.client = client
        self._pairs: list[list[str]] = []
        self._room = limit
        self._budget = budget
        self._over = 0
        self._short = 0
        self._taken = 0  # of the budget
        self._cost = 0  # of all its calls, kept or not

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

    def __repr__(self) -> str:
        return f"<ctx id={self.id!r} attempt={self.attempt!r} type={self.type!r}>"

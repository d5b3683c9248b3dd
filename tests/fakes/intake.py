"""An intake that records what it is given instead of journaling it."""

from __future__ import annotations

from collections.abc import Sequence

from queue_daemon.domain.names import JobType
from queue_daemon.journal import JournalError


class RecordingIntake:
    """Jobs as the engine hands them to the intake; ``broken`` makes them fail
    as a journal that cannot be written does. Ids are ``f<n>``, unique."""

    def __init__(self) -> None:
        self.added: list[tuple[JobType, list[str]]] = []
        self.broken = False
        self._ids = 0

    async def add(
        self,
        jobtype: JobType,
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
        ids: list[str] | None = None,
    ) -> list[str]:
        if self.broken:
            raise JournalError("the journal cannot be written")
        self.added.append((jobtype, list(payloads)))
        first, self._ids = self._ids, self._ids + len(payloads)
        return [f"f{n}" for n in range(first, self._ids)]

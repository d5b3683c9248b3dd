"""Folding the store's waiting counts: the moves each add and claim appends
are summed into one row a type, so reading the counts stays cheap (one daemon
at a time does it)."""

from __future__ import annotations

from dataclasses import dataclass

from queue_daemon.store.ports import JobQueue


@dataclass(frozen=True, slots=True, kw_only=True)
class FoldSettings:
    every: float = 1.0


class FoldCounts:
    name = "fold-counts"

    def __init__(self, *, store: JobQueue, settings: FoldSettings) -> None:
        self._store = store
        self.every = self.first = settings.every

    async def step(self) -> None:
        await self._store.fold_counts()

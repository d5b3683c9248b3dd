"""Ingesting the journals of daemons that died, while they stay dead.

A daemon that dies leaves its journal on the data directory; whatever it
acknowledged and had not yet moved into the store (all of it, when the store
was down) waits there. A daemon restarted on that directory adopts it at once
(``engine.sysid``); until then, every other daemon on the directory looks for
such journals every third of a lease: one whose file lock it can take has no
live holder, and it ingests what that journal holds, then lets go of it, so
its owner can come back to it. The dead daemon's sysid and running jobs are
the store's business (they are reset when its lease lapses).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.sysid import candidates, open_journal
from queue_daemon.settings import Settings
from queue_daemon.store.ports import JobIntake

logger = logging.getLogger(__name__)


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a journal is written or ingested (its files' sizes and times)."""
    with contextlib.suppress(OSError):
        return tuple(
            sorted((f.name, s.st_size, s.st_mtime_ns) for f in path.iterdir() for s in [f.stat()])
        )
    return ()


class Adopter:
    def __init__(self, settings: Settings, store: JobIntake, own: Path) -> None:
        self._settings = settings
        self._store = store
        self._own = own
        self._drained: dict[Path, tuple[tuple[str, int, int], ...]] = {}
        self.adopted = 0  # orphaned journals this daemon ingested

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.lease / 3)
            for path, sysid in await asyncio.to_thread(candidates, self._settings):
                await self.adopt(path, sysid)

    async def adopt(self, path: Path, sysid: str) -> bool:
        """Ingest the journal at ``path`` if no live daemon holds it; True if it did."""
        if path == self._own:  # both as the settings name them
            return False
        signature = await asyncio.to_thread(_signature, path)
        if self._drained.get(path) == signature:
            return False  # as this daemon left it: nothing new to ingest
        journal = await open_journal(path, self._settings)
        if journal is None:
            return False  # its daemon lives
        try:
            lines = journal.lag.unread_lines
            if lines:
                logger.warning(
                    "ingesting %d jobs from the journal of sysid %s, whose daemon died",
                    lines,
                    sysid,
                    extra={"action": "journal_adopted", "sysid": sysid, "lines": lines},
                )
                settings = self._settings
                ingester = Ingester(
                    journal, self._store, ingest_batch=settings.ingest_batch, ingest_workers=1
                )
                task = asyncio.create_task(ingester.run())
                try:
                    await ingester.drain(float("inf"))
                    ingester.stop()
                    await task
                finally:
                    if not task.done():  # cancelled (shutdown), perhaps with the store down
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                self.adopted += 1
        finally:
            await journal.close()
        self._drained[path] = await asyncio.to_thread(_signature, path)
        return bool(lines)

"""Dispatch at add: a few jobs that this daemon runs at once are stored, claimed
by it, while the journal writes them, instead of after.

An add of a few fresh jobs (ids made for it alone, no options, due now), all of
which the run loop takes (``Dispatcher.take``: idle slots, nothing else
waiting), while nothing else waits to be ingested, gets an ``EarlyAdd``
before its journal write. Its insert (``add_dispatched``: claimed, not flushed)
runs beside the write's fsync, and the jobs start once both are done. The
journal batch carries the EarlyAdd (``Journal.write``'s tag); the ingester that
reads the batch takes its rows as stored, flushes them with its other batches
before the read point passes them (inserting them again, claimed, if a store
crash took them: ``Ingester``), or inserts the lines itself when the early
insert failed. A write that fails takes the rows out again before the add
is refused: no job of a refused add runs. An insert whose outcome is not
known (its connection lost) is taken out again whatever the write did, so
that the ingester stores those jobs as any; an insert for a daemon whose
sysid lapsed stores nothing (no other daemon may take them before the
write's outcome is known).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from queue_daemon.domain.jobs import ClaimedJob, Dispatch, NewJob
from queue_daemon.engine.backoff import Backoff
from queue_daemon.journal import Entry, Reservation
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import JobIntake

logger = logging.getLogger(__name__)

# tries to take a refused add's rows out again (about 3 s apart in all)
REMOVE_TRIES = 7


class Dispatcher(Protocol):
    """The run loop, as ingestion sees it (``engine.run.loop.RunLoop``)."""

    def take(self, jobs: Sequence[NewJob]) -> Dispatch | None:
        """The jobs of a fresh batch that this daemon runs at once, their slots
        held (None: none)."""

    def dispatched(self, dispatch: Dispatch, claimed: Sequence[ClaimedJob]) -> None:
        """They are stored, ``claimed`` of them by this daemon: run those, let the
        rest of the holds go (called once for each ``take``, whatever happened)."""

    def still_running(self, ids: frozenset[str]) -> Dispatch | None:
        """Of ``ids``, the jobs this daemon runs now, to be stored claimed by it
        again (None: none of them)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """An early add's rows, in the store (not yet flushed)."""

    jobs: list[NewJob]
    epoch: str  # the server's, read before the insert
    added: int  # rows new
    claimed: frozenset[str]  # ids stored claimed by this daemon


class EarlyAdd:
    """One add's early insert, from the moment its journal write begins."""

    def __init__(
        self, store: JobIntake, dispatcher: Dispatcher, jobs: list[NewJob], dispatch: Dispatch
    ) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._jobs = jobs
        self._dispatch = dispatch
        self._journaled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name="early add")

    def journaled(self, ok: bool) -> None:
        """The journal write ended: durable (``ok``), or failed or abandoned."""
        if not self._journaled.done():
            self._journaled.set_result(ok)

    async def refused(self) -> None:
        """The write failed: return once the rows are out of the store again."""
        self.journaled(False)
        await asyncio.shield(self._task)

    async def stored(self) -> Stored | None:
        """The rows as stored, once the write is durable; None when the early insert
        failed or the write did (the batch's lines are to be inserted as any)."""
        return await asyncio.shield(self._task)

    async def _run(self) -> Stored | None:
        claimed: list[ClaimedJob] = []
        try:
            # the insert goes out before the journal's write begins: it is the
            # longer wait (this step runs once the add waits on the write)
            if self._journaled.done() and not self._journaled.result():
                return None  # refused before the write began (a closed journal)
            try:
                epoch = await self._store.epoch()
                added, claimed = await self._store.add_dispatched(
                    self._jobs, self._dispatch, early=True
                )
            except StoreError as exc:
                # committed or not: out again, the ingester stores them as any
                logger.info("early add failed: %s", exc, extra={"action": "early_add_failed"})
                await self._remove()
                return None
            if not await self._journaled:
                claimed = []  # the add was refused: none of them runs
                await self._remove()
                return None
            if not added:  # the sysid lapsed: nothing was stored
                return None
            # (stored, none claimed: their type is paused, and they wait)
            return Stored(self._jobs, epoch, added, frozenset(job.id for job in claimed))
        except BaseException:  # cancelled (shutting down): they run after their lease
            claimed = []
            raise
        finally:
            self._dispatcher.dispatched(self._dispatch, claimed)

    async def _remove(self) -> None:
        ids = [job.id for job in self._jobs]
        backoff = Backoff(0.05, 2.0)
        for attempt in range(REMOVE_TRIES):
            if attempt:
                await backoff.sleep()
            try:
                await self._store.remove_refused(ids, self._dispatch.sysid)
                return
            except StoreError as exc:
                reason = str(exc)
        logger.error(
            "an early add's jobs could not be taken out of the store (%s); they run "
            "once their lease ends",
            reason,
            extra={"action": "early_add_stays", "ids": ids[:10]},
        )


async def stored_early(
    reservation: Reservation, entries: list[Entry]
) -> tuple[list[Stored], list[Entry]]:
    """Of a reservation's batches, those an early add stored, and the entries of
    the others, to be inserted."""
    early: list[Stored] = []
    for batch in reservation.batches:
        stored = await batch.tag.stored() if isinstance(batch.tag, EarlyAdd) else None
        if stored is not None:
            early.append(stored)
    if not early:
        return [], entries
    done = {job.id for stored in early for job in stored.jobs}
    return early, [e for e in entries if e.id not in done]

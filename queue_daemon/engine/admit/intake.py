"""The one place that turns admitted payloads into journaled jobs (``engine.admit.adds``
admits them, for adds, follow-on jobs and schedule ticks alike): ids, the
journal's group-commit fsync, the queue log's ``added`` line, the metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from queue_daemon.domain.names import JobType
from queue_daemon.domain.options import NO_OPTIONS, JobOptions
from queue_daemon.engine.admit.ids import IdGenerator
from queue_daemon.journal import Journal
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog


class Early(Protocol):
    """An add's jobs stored while the journal writes them (``engine.ingest.early``)."""

    def journaled(self, ok: bool) -> None: ...

    async def refused(self) -> None: ...


class EarlyStarter(Protocol):
    """``Ingester.start_early``: an Early for an add, or None."""

    def __call__(
        self,
        stored_type: str,
        ids: Sequence[str],
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
    ) -> Early | None: ...


class Intake:
    def __init__(
        self,
        *,
        journal: Journal,
        ids: IdGenerator,
        queuelog: QueueLog,
        metrics: Metrics,
        early: EarlyStarter | None = None,
    ) -> None:
        self.journal = journal
        self._ids = ids
        self._queuelog = queuelog
        self._metrics = metrics
        self._early = early  # dispatch at add: the ingester's

    async def add(
        self,
        jobtype: JobType,
        payloads: Sequence[str],
        *,
        create_ms: int,
        dt_ms: int,
        ids: list[str] | None = None,
        options: JobOptions = NO_OPTIONS,
    ) -> list[str]:
        """The new jobs' ids (``ids`` when given: an idempotent add's), once their
        lines are durable. JournalError (nothing was accepted) or ValueError (a
        payload the journal cannot frame) otherwise."""
        ids = ids or self._ids.next_ids(len(payloads))
        stored = jobtype.stored
        # options are encoded here, where their journal line is written: adds
        # without them write none
        opts = options.encode() if options else ""
        early = None
        if self._early is not None and not opts:
            early = self._early(stored, ids, payloads, create_ms=create_ms, dt_ms=dt_ms)
        try:
            await self.journal.write(
                stored, ids, payloads, create_ms=create_ms, dt_ms=dt_ms, opts=opts, tag=early
            )
        except Exception:
            if early is not None:
                await early.refused()  # none of its jobs runs
            raise
        except BaseException:  # cancelled: the lines may be written still
            if early is not None:
                early.journaled(False)
            raise
        if early is not None:
            early.journaled(True)
        self._queuelog.added(stored, ids, payloads, create_ms, dt_ms)
        self._metrics.added(jobtype.client, jobtype.name, len(ids))  # once per call
        return ids

"""The server's history, as the ingest sees it: the flush that makes the rows
added before it durable, and the epoch that names the server's incarnation
(``queries.queue.EPOCH``), so that rows a restart, a backend's crash or a
standby's promotion may have taken are inserted again."""

from __future__ import annotations

import logging

import asyncpg

from queue_daemon.store import queries
from queue_daemon.store.errors import StoreError
from queue_daemon.store.pg_base import Db

logger = logging.getLogger(__name__)

# what a server that will not run the WAL functions answers: feature not
# supported, object not in prerequisite state (wal_level), insufficient privilege,
# undefined function
NO_WAL_FUNCTIONS = frozenset({"0A000", "55000", "42501", "42883"})


class HistoryPart:
    """``JobIntake.flush`` and ``JobIntake.epoch``."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._epoch: str | None = None  # the server's incarnation last seen
        self._flushed = queries.queue.FLUSHED  # without the timeline on some servers
        self._server_epoch = queries.queue.SERVER_EPOCH

    async def flush(self) -> str:
        """Return once every row added before the call is durable (WAL flushed), with
        the epoch of the server that flushed; see ``epoch``."""
        row = await self._epoch_query(flush=True)
        self._epoch = str(row["epoch"])
        return self._epoch

    async def _epoch_query(self, flush: bool) -> asyncpg.Record:
        """The flush's (or the epoch's) row; on a server that refuses the WAL
        functions the epoch is named without the timeline from then on (said once
        in the log). A standby refuses them too: that is no reason to fall back."""
        query = self._flushed if flush else self._server_epoch
        try:
            row = await self._db.fetchrow(query)
        except StoreError as exc:
            fallen_back = query not in (queries.queue.FLUSHED, queries.queue.SERVER_EPOCH)
            refused = getattr(exc.__cause__, "sqlstate", None) in NO_WAL_FUNCTIONS
            if fallen_back or not refused or await self._db.fetchval(queries.queue.IN_RECOVERY):
                raise
            if self._flushed == queries.queue.FLUSHED:
                logger.warning(
                    "the store refuses the WAL functions (%s): a standby's promotion is "
                    "told apart by the server's start time alone",
                    exc,
                    extra={"action": "store_no_timeline"},
                )
                epoch = queries.queue.EPOCH_NO_TIMELINE
                self._flushed = queries.queue.FLUSH.format(epoch=epoch)
                self._server_epoch = f"SELECT {epoch}"
            row = await self._db.fetchrow(self._flushed if flush else self._server_epoch)
        assert row is not None
        return row

    async def epoch(self) -> str:
        """The server's incarnation (its start time, its shared statistics' last
        reset and its WAL timeline: a restart, a backend's crash or a standby's
        promotion makes a new one). A flush covers only rows
        committed on its own incarnation: rows added after ``epoch`` returned E and
        flushed by a ``flush`` that returned E are durable; otherwise the server
        restarted or failed over in between and may have lost them.

        The incarnation last seen (by this call or a flush) is returned without
        asking again: it was the server's at some moment before the rows are
        added, and a server that restarted since has no connection left to that
        incarnation, so the rows land on a later one, whose flush returns another
        epoch (they are added again, and the flush's epoch is remembered). One
        round trip less for every batch the ingester moves."""
        if self._epoch is None:
            self._epoch = str((await self._epoch_query(flush=False))[0])
        return self._epoch

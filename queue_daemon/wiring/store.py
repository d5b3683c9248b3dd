"""Opening the daemon's store: the embedded PostgreSQL when no DSN is given,
and the connection pool, waiting for the server to come up."""

from __future__ import annotations

import asyncio
import logging

from queue_daemon.engine.backoff import Backoff
from queue_daemon.settings import Settings
from queue_daemon.store.embedded import EmbeddedPostgres
from queue_daemon.store.errors import StoreError, StoreUnavailable
from queue_daemon.store.pg import PgStore

logger = logging.getLogger(__name__)

POOL_SIZE = 10  # the daemon's connections to the store


async def open_store(settings: Settings) -> tuple[PgStore, EmbeddedPostgres | None]:
    """Connect (starting the embedded server if no DSN), waiting for PostgreSQL to come up."""
    embedded = None
    dsn = settings.store
    if dsn is None:
        embedded = EmbeddedPostgres(settings.data_dir)
        dsn = await asyncio.to_thread(embedded.start)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.store_connect_timeout
    backoff = Backoff(0.1, 2.0)
    while True:
        try:
            # every connection open from the start and kept: one opened on demand (auth
            # and start-up, ~10 ms) fell on a claim's way when a flood kept the rest busy
            store = await PgStore.connect(dsn, min_size=POOL_SIZE, max_size=POOL_SIZE, idle_close=0)
            return store, embedded
        except StoreUnavailable as exc:
            if loop.time() >= deadline:
                if embedded is not None:
                    await asyncio.to_thread(embedded.stop_if_last)
                raise StoreError(f"cannot reach the store: {exc}") from exc
            logger.warning("waiting for the store: %s", exc, extra={"action": "store_wait"})
            await backoff.sleep()

"""What the metrics read from the daemon's parts when scraped."""

from __future__ import annotations

import time

from queue_daemon.engine import sysid as sysids
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.run.loop import RunLoop
from queue_daemon.observe.collectors import Sources
from queue_daemon.runners.pool import RunnerPool


def sources(
    identity: sysids.Identity, ingester: Ingester, run_loop: RunLoop, pool: RunnerPool
) -> Sources:
    """What the metrics read from the daemon's parts when scraped."""
    journal = identity.journal

    def journal_lag() -> tuple[int, int, int | None]:
        lag = journal.lag
        return lag.unread_lines, lag.unread_bytes, lag.oldest_unread_ms

    return Sources(
        sysid=identity.sysid,
        journal_lag=journal_lag,
        journal_writable=lambda: journal.write_problem() is None,
        ingested=lambda: ingester.ingested,
        running=lambda: run_loop.running,
        contexts=pool.contexts_by_lang,
        cold_starts=lambda: pool.cold_starts,
        output_throttled=lambda: pool.output_budget.throttled,
        lease_age=lambda: time.monotonic() - identity.renewed_at,
        lease_lost=lambda: identity.lost,
        renew_failures=lambda: identity.renew_failures,
    )

"""The engine as the daemon wires it (``queue_daemon.wiring.engine``), built for
tests around a store and a runner pool of the test's choosing, and run until
the test ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from queue_daemon.engine.admit.adds import Adds, KnownJobs
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits, TenantLimits
from queue_daemon.engine.admit.quotas import RateLimiter, WaitingLimiter
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.run.batch import Runners
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.store.ports import Store
from queue_daemon.wiring.engine import Engine, EngineSettings, build_engine

# no quota in the way of follow-on jobs (the waiting limit 0: no count is read)
NO_QUOTAS = TenantLimits(waiting=0)


async def no_uid(client: str) -> None:
    """Tenants need no uid slot of their own here."""


def engine_of(
    store: Any,
    pool: Any,
    *,
    intake: Any,
    queuelog: QueueLog,
    settings: EngineSettings,
    metrics: Metrics | None = None,
    sysid: str = "s1",
) -> Engine:
    """The engine over ``store`` (a real one, a fake or a wrapper), ``pool`` and
    ``intake`` (where follow-on jobs go)."""
    metrics = metrics or Metrics()
    limits = Limits(NO_QUOTAS)
    typed = cast(Store, store)
    adds = Adds(
        intake=cast(Intake, intake),
        limits=limits,
        rates=RateLimiter(0, 1),
        waiting=WaitingLimiter(typed),
        jobs=cast(KnownJobs, store),
        queuelog=queuelog,
        metrics=metrics,
    )
    return build_engine(
        store=typed,
        pool=cast(Runners, pool),
        handlers=HandlerCache(typed),
        adds=adds,
        limits=limits,
        queuelog=queuelog,
        metrics=metrics,
        sysid=sysid,
        ensure_uid=no_uid,
        settings=settings,
    )


@contextlib.asynccontextmanager
async def run_engine(engine: Engine, store: Any) -> AsyncIterator[Engine]:
    """The engine's loops (notices, run loop, upkeep) as the daemon starts them,
    until the block ends."""
    tasks = [
        asyncio.create_task(engine.notices.listen(cast(Store, store))),
        asyncio.create_task(engine.run_loop.run()),
        asyncio.create_task(engine.upkeep.run()),
    ]
    try:
        yield engine
    finally:
        for task in tasks:
            task.cancel()
        async with asyncio.timeout(10):  # the engine ends when cancelled
            results = await asyncio.gather(*tasks, return_exceptions=True)
        failed = [r for r in results if not isinstance(r, asyncio.CancelledError | type(None))]
        assert failed == [], failed

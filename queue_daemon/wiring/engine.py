"""Building the engine: the shared results-to-releases step, the run loop and its
bookkeeping, the pull workers' jobs, the store's notices and the periodic
services under their supervisor. Every part is built here and handed to the
parts that use it; none builds another's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from queue_daemon.engine.admit.adds import Adds
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.notices import Notices, OnDone
from queue_daemon.engine.progress import ProgressBoard
from queue_daemon.engine.pull.pulls import Pulls
from queue_daemon.engine.releases import Releases
from queue_daemon.engine.run.batch import BatchRunner, EnsureUid, Runners
from queue_daemon.engine.run.busy import BusyMarking, BusySettings
from queue_daemon.engine.run.fairness import TenantBatches
from queue_daemon.engine.run.loop import RunLoop, RunSettings
from queue_daemon.engine.run.pick import WaitingTypes
from queue_daemon.engine.run.sizes import BatchSizes
from queue_daemon.engine.upkeep.counts import FoldCounts, FoldSettings
from queue_daemon.engine.upkeep.deadlines import Deadlines, DeadlineSettings
from queue_daemon.engine.upkeep.expire import Expire, ExpireSettings
from queue_daemon.engine.upkeep.purge import Purge, PurgeSettings
from queue_daemon.engine.upkeep.renew import Renew, RenewSettings
from queue_daemon.engine.upkeep.supervisor import Service, Supervisor
from queue_daemon.engine.upkeep.unhandled import SweepSettings, SweepUnhandled
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.tracing import Tracing
from queue_daemon.scheduler import Scheduler
from queue_daemon.settings import DEFAULTS, Settings
from queue_daemon.store.ports import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    run: RunSettings = field(default_factory=RunSettings)
    job_ttl: float = DEFAULTS.job_ttl  # seconds from a job's creation after which retries stop
    retention: float = DEFAULTS.retention  # seconds done jobs are kept

    @classmethod
    def of(cls, settings: Settings) -> EngineSettings:
        """The engine's part of the daemon's settings."""
        return cls(
            run=RunSettings(
                concurrency=settings.concurrency,
                max_batch=settings.max_batch,
                tenant_running=settings.tenant_running,
                lease=settings.lease,
            ),
            job_ttl=settings.job_ttl,
            retention=settings.retention,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """The engine's long-lived parts, which the app starts and stops."""

    run_loop: RunLoop
    pulls: Pulls
    notices: Notices  # its listen() hears the store's notices
    upkeep: Supervisor  # the periodic services


def build_engine(
    *,
    store: Store,
    pool: Runners,
    handlers: HandlerCache,
    adds: Adds,
    limits: Limits,
    queuelog: QueueLog,
    metrics: Metrics,
    sysid: str,
    ensure_uid: EnsureUid,
    settings: EngineSettings,
    done: Sequence[OnDone] = (),
    tracing: Tracing | None = None,
) -> Engine:
    """The engine's parts, wired; ``done``: told of done jobs (held GETs)."""
    run = settings.run
    progress = ProgressBoard(store=store, sysid=sysid)
    releases = Releases(
        adds=adds,
        limits=limits,
        metrics=metrics,
        job_ttl=settings.job_ttl,
        progress=progress.ran,
    )
    scheduler = Scheduler(
        concurrency=run.concurrency, tenant_running=run.tenant_running, max_batch=run.max_batch
    )

    # per-tenant limits: running caps go to the scheduler, the rest apply where they are used
    def limits_changed(limits: Limits) -> None:
        scheduler.set_tenant_caps(
            {client: t.running or None for client, t in limits.overridden().items()}
        )

    limits.on_change(limits_changed)
    sizes = BatchSizes(run.max_batch)
    tenants = TenantBatches(run.max_parallel_batches)
    run_loop = RunLoop(
        store=store,
        scheduler=scheduler,
        waiting=WaitingTypes(store),
        sizes=sizes,
        tenants=tenants,
        batches=BatchRunner(
            pool=pool,
            handlers=handlers,
            releases=releases,
            ensure_uid=ensure_uid,
            queuelog=queuelog,
            metrics=metrics,
            sizes=sizes,
            progress=progress,
        ),
        pool=pool,
        handlers=handlers,
        queuelog=queuelog,
        metrics=metrics,
        sysid=sysid,
        settings=run,
        tracing=tracing,
    )
    pulls = Pulls(
        store=store,
        handlers=handlers,
        releases=releases,
        queuelog=queuelog,
        metrics=metrics,
        progress=progress,
        tracing=tracing,
    )
    notices = Notices(
        jobs=[run_loop.on_jobs, pulls.waits.on_jobs],
        handlers=[run_loop.on_handler],
        done=done,
        cancels=[run_loop.on_cancel],
    )
    services: list[Service] = [
        Renew(
            store=store,
            sysid=sysid,
            running=run_loop.running_ids,
            settings=RenewSettings(lease=run.lease),
        ),
        Expire(
            store=store,
            queuelog=queuelog,
            metrics=metrics,
            on_waiting=notices.on_jobs,
            settings=ExpireSettings(lease=run.lease),
        ),
        Deadlines(store=store, queuelog=queuelog, metrics=metrics, settings=DeadlineSettings()),
        FoldCounts(store=store, settings=FoldSettings()),
        SweepUnhandled(
            store=store,
            queuelog=queuelog,
            metrics=metrics,
            settings=SweepSettings(job_ttl=settings.job_ttl),
        ),
        Purge(store=store, queuelog=queuelog, settings=PurgeSettings(retention=settings.retention)),
        BusyMarking(pool=pool, tenants=tenants, settings=BusySettings()),
        progress,
    ]
    return Engine(run_loop=run_loop, pulls=pulls, notices=notices, upkeep=Supervisor(services))

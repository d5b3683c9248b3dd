"""The one place that wires journal, store, ingester, worker, runners and HTTP into a daemon.

Start order: store (embedded PostgreSQL if no DSN) → migrations → sysid and
journal → tenant cache → ingester, worker (claim loop, leases, expiry, purge),
the schedules' ticker and runner pool → HTTP. Stop order (SIGTERM): stop
accepting requests and finish the ones in flight → stop adding schedule ticks →
stop claiming; running jobs finish within the
drain timeout or go back to the store at once → close the runner contexts →
let the ingester catch up with what was acknowledged (bounded by the drain
timeout) → write the rest of the queue logfile (fsync) → close the journal
(fsync) → release the sysid → close the pool → stop the embedded PostgreSQL
if no other daemon uses it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from queue_daemon import memory
from queue_daemon.api.auth import TokenCache
from queue_daemon.api.bodies import BodyBudget
from queue_daemon.api.reads import CoalescedReads
from queue_daemon.api.routes import build_app
from queue_daemon.api.server import AppRunner, ConnectionCaps, quiet_exhaustion
from queue_daemon.api.web import Services
from queue_daemon.engine import sysid as sysids
from queue_daemon.engine.admit.ids import IdGenerator
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.engine.admit.quotas import Admission, RateLimiter, WaitingLimiter
from queue_daemon.engine.backoff import Backoff
from queue_daemon.engine.graph import Resolved
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.ingest.adoption import Adopter
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.pull.holds import DoneWaits
from queue_daemon.engine.pull.pulls import Pulls
from queue_daemon.engine.run.loop import Worker, WorkerSettings
from queue_daemon.engine.schedule.ticker import Ticker
from queue_daemon.observe.collectors import Sources
from queue_daemon.observe.logfile import Rotation
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.overview import Overview
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.throughput import Throughput
from queue_daemon.placement import (
    CpuPlacement,
    protect_daemon_files,
    raise_open_files_limit,
    runner_work_root,
)
from queue_daemon.runners.pool import RunnerPool, RunnerSettings
from queue_daemon.runners.sandbox import TenantUids
from queue_daemon.settings import Settings
from queue_daemon.store.embedded import EmbeddedPostgres
from queue_daemon.store.errors import StoreError, StoreUnavailable
from queue_daemon.store.pg import PgStore

logger = logging.getLogger(__name__)

# descriptors kept from client connections: the store's pool, the journal, the
# queue log and the runners' contexts (pipes) and shell jobs
FD_RESERVE = 1024
READ_INTERVAL = 0.1  # seconds between two reads of one tenant's stats or page of jobs

LINGERING_TIME = 1.0  # seconds; see AppRunner below


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


class Supervisor:
    """Background tasks whose failure is logged and stops the daemon, never lost."""

    def __init__(self, on_failure: Callable[[], None]) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_failure = on_failure

    def start(self, name: str, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error(
                "background task %s failed",
                task.get_name(),
                exc_info=exc,
                extra={"action": "task_failed", "task": task.get_name()},
            )
            self._on_failure()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _sources(
    identity: sysids.Identity, ingester: Ingester, worker: Worker, pool: RunnerPool
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
        running=lambda: worker.running,
        contexts=pool.contexts_by_lang,
        cold_starts=lambda: pool.cold_starts,
        output_throttled=lambda: pool.output_budget.throttled,
        lease_age=lambda: time.monotonic() - identity.renewed_at,
        lease_lost=lambda: identity.lost,
        renew_failures=lambda: identity.renew_failures,
    )


class Daemon:
    """One daemon's parts, started and stopped in the order of the module docstring."""

    def __init__(self, settings: Settings, on_failure: Callable[[], None]) -> None:
        self.settings = settings
        self.supervisor = Supervisor(on_failure)
        self.store: PgStore | None = None
        self.embedded: EmbeddedPostgres | None = None
        self.cpu_place = CpuPlacement()
        self.identity: sysids.Identity | None = None
        self.queuelog: QueueLog | None = None
        self.ingester: Ingester | None = None
        self.pool: RunnerPool | None = None
        self.worker: Worker | None = None
        self.pulls: Pulls | None = None
        self.done_waits: DoneWaits | None = None
        self.ticker: asyncio.Task[Any] | None = None
        self.waiting: WaitingLimiter | None = None
        self.runner: AppRunner | None = None
        self.connections: ConnectionCaps | None = None
        self.url = ""

    async def start(self) -> None:
        settings = self.settings
        open_files = raise_open_files_limit()
        quiet_exhaustion(asyncio.get_running_loop())
        # the queue log and the runners' work root live here even when the store
        # is external and the journal elsewhere
        made_data_dir = not settings.data_dir.exists()
        settings.data_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        logger.debug("open files limit %d", open_files, extra={"action": "nofile_limit"})
        if settings.store is None:
            # the embedded server's processes start in the daemon's CPU place, ahead
            # of handlers as the daemon is (they stay in the cgroup they start in)
            await self.cpu_place.take()
        self.store, self.embedded = store, _ = await open_store(settings)
        if self.embedded is not None:
            self.cpu_place.serve(self.embedded.pgdata)
        self.identity = identity = await sysids.acquire(store, settings)
        journal = identity.journal
        limits = Limits(settings.tenant_defaults())
        tokens = TokenCache(store, limits)
        await tokens.reload()
        handlers = HandlerCache(store)
        ids = IdGenerator(identity.sysid)
        self.queuelog = queuelog = QueueLog(
            settings.logfile_path(identity.sysid),
            sysid=identity.sysid,
            rotation=Rotation(
                logfile_max_bytes=settings.logfile_max_bytes,
                logfile_daily=settings.logfile_daily,
                logfile_gzip=settings.logfile_gzip,
            ),
        )
        await asyncio.to_thread(queuelog.compress_leftovers)
        await asyncio.to_thread(
            protect_daemon_files,
            settings.data_dir,
            settings.journal_dir(identity.sysid),
            settings.logfile_path(identity.sysid),
            made=made_data_dir,
        )
        work_root = await asyncio.to_thread(runner_work_root, settings.data_dir)
        self.ingester = ingester = Ingester(
            journal, store, batch=settings.ingest_batch, workers=settings.ingest_workers
        )
        uids = TenantUids(
            lambda: tokens.uid_slots, settings.tenant_uid_base, settings.tenant_uid_count
        )
        self.pool = pool = RunnerPool(
            RunnerSettings(
                work_root=work_root,
                run_as=settings.run_as,
                context_idle=settings.context_idle,
                payload_limit=settings.payload_limit,
                result_limit=settings.result_limit,
                http_allow=settings.http_allow,
                realtime=settings.realtime,
                output_rate=settings.output_rate,
                tmp_size=settings.tmp_size,
                output_burst=4 * settings.output_rate,
            ),
            tenant_uids=uids,
        )
        metrics = Metrics(
            metrics_tenants=settings.metrics_tenants, metrics_types=settings.metrics_types
        )
        intake = Intake(journal=journal, ids=ids, queuelog=queuelog, metrics=metrics)
        self.waiting = WaitingLimiter(store, settings.waiting_refresh)
        admission = Admission(
            RateLimiter(settings.tenant_rate, settings.tenant_burst), self.waiting
        )
        self.pulls = pulls = Pulls(
            store=store,
            handlers=handlers,
            intake=intake,
            admission=admission,
            limits=limits,
            queuelog=queuelog,
            metrics=metrics,
            job_ttl=settings.job_ttl,
        )
        self.done_waits = done_waits = DoneWaits(store.done_among)
        store.on_resolved = Resolved(queuelog, metrics)
        self.worker = worker = Worker(
            store=store,
            intake=intake,
            pool=pool,
            handlers=handlers,
            queuelog=queuelog,
            sysid=identity.sysid,
            settings=WorkerSettings(
                concurrency=settings.concurrency,
                max_batch=settings.max_batch,
                tenant_running=settings.tenant_running,
                lease=settings.lease,
                job_ttl=settings.job_ttl,
                retention=settings.retention,
                payload_limit=settings.payload_limit,
            ),
            limits=limits,
            metrics=metrics,
            admission=admission,
            ensure_uid=tokens.ensure_uid_slot,
            jobs_noted=pulls.waits.on_jobs,
            done_noted=done_waits.on_done,
        )
        metrics.watch(store, _sources(identity, ingester, worker, pool))
        supervisor = self.supervisor
        supervisor.start("ingester", ingester.run())
        adopter = Adopter(settings, store, settings.journal_dir(identity.sysid))
        supervisor.start("journal-adoption", adopter.run())
        supervisor.start("memory", memory.give_back())
        supervisor.start("worker", worker.run())
        supervisor.start("runner-pool", pool.run())
        supervisor.start("sysid-lease", sysids.keep_leased(store, identity, settings.lease))
        supervisor.start("token-cache", tokens.run(settings.token_refresh))
        supervisor.start("queue-log", queuelog.run())
        supervisor.start("done-waits", done_waits.run())
        throughput = Throughput()
        supervisor.start("throughput", throughput.run(store))
        ticker = Ticker(
            store=store,
            intake=intake,
            limits=limits,
            admission=admission,
            queuelog=queuelog,
            metrics=metrics,
            sysid=identity.sysid,
        )
        self.ticker = supervisor.start("schedules", ticker.run())

        services = Services(
            settings=settings,
            store=store,
            journal=journal,
            intake=intake,
            tokens=tokens,
            ingester=ingester,
            queuelog=queuelog,
            handlers=handlers,
            rates=admission.rates,
            waiting=admission.waiting,
            limits=limits,
            overview=Overview(store, throughput, identity.sysid),
            sysid=identity.sysid,
            identity=identity,
            metrics=metrics,
            reads=CoalescedReads(READ_INTERVAL),
            pulls=pulls,
            done_waits=done_waits,
            bodies=BodyBudget(
                settings.body_memory, max(settings.body_memory // 4, settings.body_limit)
            ),
            ticker=ticker,
        )
        # aiohttp's keep-alive timer runs from the connection's start (and from each
        # reply) and closes a connection still waiting for a whole request; with the
        # client timeout it is the deadline for a request's headers, so slow or idle
        # clients cannot hold connections (its default is an hour)
        self.connections = ConnectionCaps(
            settings.max_connections or max(64, open_files - FD_RESERVE),
            settings.max_connections_per_address,
        )
        self.runner = runner = AppRunner(
            build_app(services),
            caps=self.connections,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=settings.client_timeout,
            # after a reply to a request whose body was not read (408, 413, 401...),
            # what still comes is read and dropped this long before the connection
            # closes, so the client gets the reply rather than a reset (aiohttp: 10 s)
            lingering_time=LINGERING_TIME,
        )
        await runner.setup()
        site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
        await site.start()
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        logger.info(
            "listening on %s as sysid %s", self.url, identity.sysid, extra={"action": "ready"}
        )

    def _end_waits(self) -> None:
        """Held claims and GETs answer now (with what there is), not at their timeout."""
        if self.pulls is not None:
            self.pulls.waits.close()
        if self.done_waits is not None:
            self.done_waits.close()

    async def stop(self) -> None:
        """Graceful when start() completed; otherwise closes whatever was opened."""
        settings = self.settings
        self._end_waits()
        if self.runner is not None:
            await self.runner.cleanup()  # stop accepting; requests in flight finish
        if self.ticker is not None:
            self.ticker.cancel()  # no more ticks: a tick journaled but not recorded is re-added
        if self.worker is not None:
            await self.worker.drain(settings.drain_timeout)  # running jobs finish or go back
        if self.pool is not None:
            await self.pool.close()
        if self.ingester is not None and self.identity is not None:
            if not await self.ingester.drain(settings.drain_timeout):
                logger.warning(
                    "drain timed out; the rest stays in the journal for the next start",
                    extra={"action": "drain_timeout"},
                )
            self.ingester.stop()
        await self.supervisor.cancel_all()
        if self.waiting is not None:
            await self.waiting.close()
        if self.queuelog is not None:
            await self.queuelog.close()
        if self.identity is not None:
            await self.identity.journal.close()
            if self.store is not None:
                try:
                    await self.store.release_sysid(self.identity.sysid, holder=self.identity.holder)
                except StoreError as exc:
                    logger.warning("sysid not released: %s", exc, extra={"action": "sysid_release"})
        if self.store is not None:
            await self.store.close()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop_if_last)
        await self.cpu_place.release()


async def serve(settings: Settings, ready: Callable[[str], None] | None = None) -> int:
    """Run a daemon until SIGTERM/SIGINT; return the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failed = False

    def fail() -> None:
        nonlocal failed
        failed = True
        stop.set()

    daemon = Daemon(settings, fail)
    try:
        await daemon.start()
        settle_heap()
        if ready is not None:
            ready(daemon.url)
        await stop.wait()
        logger.info("stopping", extra={"action": "stopping"})
    finally:
        await daemon.stop()
    logger.info("stopped", extra={"action": "stopped"})
    return 1 if failed else 0


def settle_heap() -> None:
    """Take what start-up built (modules, pools, routes: ~45k objects) out of the cyclic
    collector's sight. A full collection walks every tracked object and runs on the event
    loop: 20-30 ms on two slow cores with them, a stall that every add, claim and ack
    waiting at that moment pays. Frozen, a full collection walks only what the daemon
    made since; objects frozen here are still freed by reference counting."""
    gc.collect()
    gc.freeze()


def print_ready(url: str) -> None:
    sys.stdout.write(f"listening on {url}\n")
    sys.stdout.flush()

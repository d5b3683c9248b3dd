"""The one place that wires journal, store, ingester, engine, runners and HTTP into a daemon
(the engine's parts are built by ``queue_daemon.wiring.engine``).

Start order: store (embedded PostgreSQL if no DSN) → migrations → sysid and
journal → tenant cache → ingester, the engine (the store's notices, the run
loop's claim loops, the upkeep services: leases, expiry, purge...), the
schedules' ticker and runner pool → HTTP. Stop order (SIGTERM): stop
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
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from queue_daemon import memory
from queue_daemon.api.bodies import BodyBudget
from queue_daemon.api.reads import CoalescedReads
from queue_daemon.api.routes import build_app
from queue_daemon.api.server import AppRunner, ConnectionCaps, quiet_exhaustion
from queue_daemon.api.tokens import TokenCache
from queue_daemon.api.web import Services
from queue_daemon.engine import sysid as sysids
from queue_daemon.engine.admit.adds import Adds
from queue_daemon.engine.admit.ids import IdGenerator
from queue_daemon.engine.admit.intake import Intake
from queue_daemon.engine.admit.limits import Limits
from queue_daemon.engine.admit.quotas import RateLimiter, WaitingLimiter
from queue_daemon.engine.graph import Resolved
from queue_daemon.engine.handlers import HandlerCache
from queue_daemon.engine.ingest.adoption import Adopter
from queue_daemon.engine.ingest.ingester import Ingester
from queue_daemon.engine.ingest.recent import RECENT_BYTES
from queue_daemon.engine.pull.holds import DoneWaits
from queue_daemon.engine.pull.pulls import Pulls
from queue_daemon.engine.run.loop import RunLoop
from queue_daemon.engine.schedule.ticker import Ticker
from queue_daemon.observe.logfile import Rotation
from queue_daemon.observe.metrics import Metrics
from queue_daemon.observe.overview import Overview
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.throughput import Throughput
from queue_daemon.observe.tracing import Tracing
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
from queue_daemon.store.errors import StoreError
from queue_daemon.store.pg import PgStore
from queue_daemon.wiring.engine import EngineSettings, build_engine
from queue_daemon.wiring.metrics import sources
from queue_daemon.wiring.store import open_store
from queue_daemon.wiring.tasks import Tasks

if TYPE_CHECKING:
    from queue_daemon.observe.mdns import Advertiser

logger = logging.getLogger(__name__)

# descriptors kept from client connections: the store's pool, the journal, the
# queue log and the runners' contexts (pipes) and shell jobs
FD_RESERVE = 1024
READ_INTERVAL = 0.1  # seconds between two reads of one tenant's stats or page of jobs

LINGERING_TIME = 1.0  # seconds; see AppRunner below


class Daemon:
    """One daemon's parts, started and stopped in the order of the module docstring."""

    def __init__(self, settings: Settings, on_failure: Callable[[], None]) -> None:
        self.settings = settings
        self.tasks = Tasks(on_failure)
        self.store: PgStore | None = None
        self.embedded: EmbeddedPostgres | None = None
        self.cpu_place = CpuPlacement()
        self.identity: sysids.Identity | None = None
        self.queuelog: QueueLog | None = None
        self.ingester: Ingester | None = None
        self.pool: RunnerPool | None = None
        self.run_loop: RunLoop | None = None
        self.pulls: Pulls | None = None
        self.done_waits: DoneWaits | None = None
        self.ticker: asyncio.Task[Any] | None = None
        self.waiting: WaitingLimiter | None = None
        self.runner: AppRunner | None = None
        self.connections: ConnectionCaps | None = None
        self.url = ""
        self.advertiser: Advertiser | None = None  # serve --mdns
        self.tracing = Tracing.off()  # --otlp-endpoint

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
            # the embedded server's processes start in the daemon's CPU place and
            # share its weight (they stay in the cgroup they start in)
            await self.cpu_place.take()
        self.store, self.embedded = store, _ = await open_store(settings)
        if self.embedded is not None:
            self.cpu_place.serve(self.embedded.pgdata)
        self.identity = identity = await sysids.acquire(store, settings)
        self.tracing = tracing = Tracing.start(settings.otlp_endpoint)
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
        # admission counts the jobs admitted here until the ingester stores them
        self.waiting = waiting = WaitingLimiter(store, settings.waiting_refresh)
        self.ingester = ingester = Ingester(
            journal,
            store,
            ingest_batch=settings.ingest_batch,
            ingest_workers=settings.ingest_workers,
            on_stored=waiting.stored,
            tracing=tracing,
            # the embedded server has no standby that could be promoted: nothing to replay
            keep_bytes=0 if self.embedded is not None else RECENT_BYTES,
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
                share=settings.handler_share,
                trust_tenants=settings.trust_tenants,
                realtime=settings.realtime,
                output_rate=settings.output_rate,
                tmp_size=settings.tmp_size,
                output_burst=4 * settings.output_rate,
                wasm_memory=settings.wasm_memory,
                wasm_cache=settings.data_dir / "wasm-cache",
            ),
            tenant_uids=uids,
            blobs=store.read_blob,
        )
        metrics = Metrics(
            metrics_tenants=settings.metrics_tenants, metrics_types=settings.metrics_types
        )
        adds = Adds(
            intake=Intake(
                journal=journal,
                ids=ids,
                queuelog=queuelog,
                metrics=metrics,
                early=ingester.start_early,
            ),
            limits=limits,
            rates=RateLimiter(settings.tenant_rate, settings.tenant_burst),
            waiting=waiting,
            jobs=store,
            queuelog=queuelog,
            metrics=metrics,
        )
        self.done_waits = done_waits = DoneWaits(store.done_among)
        store.on_resolved = Resolved(queuelog, metrics)
        engine = build_engine(
            store=store,
            pool=pool,
            handlers=handlers,
            adds=adds,
            limits=limits,
            queuelog=queuelog,
            metrics=metrics,
            sysid=identity.sysid,
            ensure_uid=tokens.ensure_uid_slot,
            settings=EngineSettings.of(settings),
            done=[done_waits.on_done],
            tracing=tracing,
        )
        self.pulls = pulls = engine.pulls
        self.run_loop = run_loop = engine.run_loop
        ingester.dispatcher = run_loop  # a few jobs added to an idle daemon run at once
        metrics.watch(store, sources(identity, ingester, run_loop, pool))
        tasks = self.tasks
        tasks.start("ingester", ingester.run())
        adopter = Adopter(settings, store, settings.journal_dir(identity.sysid))
        tasks.start("journal-adoption", adopter.run())
        tasks.start("memory", memory.give_back())
        tasks.start("notices", engine.notices.listen(store))
        tasks.start("run-loop", run_loop.run())
        tasks.start("upkeep", engine.upkeep.run())
        tasks.start("runner-pool", pool.run())
        tasks.start("sysid-lease", sysids.keep_leased(store, identity, settings.lease))
        tasks.start("token-cache", tokens.run(settings.token_refresh))
        tasks.start("queue-log", queuelog.run())
        tasks.start("done-waits", done_waits.run())
        throughput = Throughput()
        tasks.start("throughput", throughput.run(store))
        ticker = Ticker(
            store=store,
            adds=adds,
            queuelog=queuelog,
            metrics=metrics,
            sysid=identity.sysid,
        )
        self.ticker = tasks.start("schedules", ticker.run())

        services = Services(
            settings=settings,
            adds=adds,
            jobs=store,
            tenants=store,
            handler_store=store,
            schedules=store,
            blobs=store,
            pulled=store,
            dashboard=store,
            ping=store.ping,
            journal=journal,
            tokens=tokens,
            ingester=ingester,
            queuelog=queuelog,
            handlers=handlers,
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
            tracing=tracing,
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
        if settings.mdns:
            from queue_daemon.observe.mdns import Advertiser  # zeroconf only when asked

            self.advertiser = Advertiser(identity.sysid, settings.host, port)
            await self.advertiser.start()

    def _end_waits(self) -> None:
        """Held claims and GETs answer now (with what there is), not at their timeout."""
        if self.pulls is not None:
            self.pulls.waits.close()
        if self.done_waits is not None:
            self.done_waits.close()

    async def stop(self) -> None:
        """Graceful when start() completed; otherwise closes whatever was opened."""
        settings = self.settings
        if self.advertiser is not None:
            await self.advertiser.stop()  # no new clients find a daemon that stops
        self._end_waits()
        if self.runner is not None:
            await self.runner.cleanup()  # stop accepting; requests in flight finish
        if self.ticker is not None:
            self.ticker.cancel()  # no more ticks: a tick journaled but not recorded is re-added
        if self.run_loop is not None:
            await self.run_loop.drain(settings.drain_timeout)  # running jobs finish or go back
        if self.pool is not None:
            await self.pool.close()
        if self.ingester is not None and self.identity is not None:
            if not await self.ingester.drain(settings.drain_timeout):
                logger.warning(
                    "drain timed out; the rest stays in the journal for the next start",
                    extra={"action": "drain_timeout"},
                )
            self.ingester.stop()
        await self.tasks.cancel_all()
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
        await asyncio.to_thread(self.tracing.shutdown)  # the spans not sent yet
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
        memory.settle_heap()
        if ready is not None:
            ready(daemon.url)
        await stop.wait()
        logger.info("stopping", extra={"action": "stopping"})
    finally:
        await daemon.stop()
    logger.info("stopped", extra={"action": "stopped"})
    return 1 if failed else 0


def print_ready(url: str) -> None:
    sys.stdout.write(f"listening on {url}\n")
    sys.stdout.flush()

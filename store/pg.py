"""``PgStore``: the ``queue_daemon.store.ports.Store`` on PostgreSQL through an asyncpg pool,
composed of one part per concern of the ports (see ``store/ports.py``).

The parts share one ``Db`` (the pool and its life, ``pg_base``); the parts
whose statements end jobs (jobs, queue, pulled) are given the graph part, which
resolves those jobs' dependents. ``PgStore`` builds them and exposes each
port's calls as its own, so callers hold one object (``store.claim(...)``);
the parts stay reachable (``store.queue``, ...) for what reads one concern.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

import asyncpg

from queue_daemon.domain.jobs import Resolution
from queue_daemon.store.pg_base import Db, open_pool
from queue_daemon.store.pg_blobs import BlobsPart
from queue_daemon.store.pg_graph import GraphPart
from queue_daemon.store.pg_handlers import HandlersPart
from queue_daemon.store.pg_history import HistoryPart
from queue_daemon.store.pg_jobs import JobsPart
from queue_daemon.store.pg_pulled import PulledPart
from queue_daemon.store.pg_queue import QueuePart
from queue_daemon.store.pg_schedules import SchedulesPart
from queue_daemon.store.pg_tenants import TenantsPart

__all__ = ["PgStore"]


class PgStore:
    """The job store on PostgreSQL.

    Every call takes a connection from the pool and returns it; asyncpg errors
    leave as ``queue_daemon.store.errors`` (``StoreUnavailable`` when the server cannot be
    reached). The pool replaces dead connections on its own, so the first call
    after PostgreSQL comes back works without any reconnect by the caller.
    """

    def __init__(
        self, pool: asyncpg.Pool, *, acquire_timeout: float, dsn: str | None = None
    ) -> None:
        self.db = db = Db(pool, acquire_timeout=acquire_timeout, dsn=dsn)
        self.graph = graph = GraphPart(db)
        self.history = history = HistoryPart(db)
        self.jobs = jobs = JobsPart(db, graph, history)
        self.queue = queue = QueuePart(db, graph)
        self.pulled = pulled = PulledPart(db, graph)
        self.tenants = tenants = TenantsPart(db)
        self.handlers = handlers = HandlersPart(db)
        self.schedules = schedules = SchedulesPart(db)
        self.blobs = blobs = BlobsPart(db)

        # the connection's life
        self.close = db.close
        self.ping = db.ping
        self.applied_migrations = db.applied_migrations
        self._conn = db.conn  # for tests that look at a pooled connection
        self._pool = pool
        # JobIntake
        self.add_jobs = jobs.add_jobs
        self.add_dispatched = jobs.add_dispatched
        self.remove_refused = jobs.remove_refused
        self.add_opted = graph.add_opted
        self.flush = history.flush
        self.epoch = history.epoch
        # JobQueue
        self.waiting_jobtypes = queue.waiting_jobtypes
        self.claim = queue.claim
        self.unhandled_types = queue.unhandled_types
        self.expire_waiting = queue.expire_waiting
        self.renew = queue.renew
        self.note_progress = queue.note_progress
        self.release = queue.release
        self.expire_locks = queue.expire_locks
        self.purge = queue.purge
        self.fold_counts = queue.fold_counts
        self.notify_jobs = queue.notify_jobs
        self.forget_workers = pulled.forget_workers
        self.expire_deadlines = graph.expire_deadlines
        self.resolve_pending = graph.resolve_pending
        self.resolve = graph.resolve
        self.listen = queue.listen
        # JobQueries
        self.get_job = jobs.get_job
        self.list_jobs = jobs.list_jobs
        self.stats = jobs.stats
        self.cancel_job = jobs.cancel_job
        self.delete_done = jobs.delete_done
        self.rerun_job = jobs.rerun_job
        self.rerun_done = jobs.rerun_done
        self.pause_type = jobs.pause_type
        self.pause_tenant = jobs.pause_tenant
        self.paused = jobs.paused
        self.paused_counts = jobs.paused_counts
        # TenantStore
        self.add_tenant = tenants.add_tenant
        self.list_tenants = tenants.list_tenants
        self.rotate_tenant = tenants.rotate_tenant
        self.revoke_tenant = tenants.revoke_tenant
        self.tenant_tokens = tenants.tenant_tokens
        self.tenant_uid_slots = tenants.tenant_uid_slots
        self.ensure_uid_slot = tenants.ensure_uid_slot
        self.tenant_limits = tenants.tenant_limits
        self.get_tenant_limits = tenants.get_tenant_limits
        self.set_tenant_limits = tenants.set_tenant_limits
        self.count_waiting = tenants.count_waiting
        self.new_admin_token = tenants.new_admin_token
        self.revoke_admin_tokens = tenants.revoke_admin_tokens
        self.admin_tokens = tenants.admin_tokens
        self.token_key = tenants.token_key
        # HandlerStore
        self.get_handler = handlers.get_handler
        self.put_handler = handlers.put_handler
        self.delete_handler = handlers.delete_handler
        self.count_handlers = handlers.count_handlers
        # BlobStore
        self.put_blob = blobs.put_blob
        self.read_blob = blobs.read_blob
        self.delete_blob = blobs.delete_blob
        # SysidLeases
        self.reserve_sysid = queue.reserve_sysid
        self.renew_sysid = queue.renew_sysid
        self.release_sysid = queue.release_sysid
        # Dashboard
        self.queue_depths = handlers.queue_depths
        self.running_jobs = handlers.running_jobs
        self.recent_failures = handlers.recent_failures
        self.daemon_leases = handlers.daemon_leases
        self.workers = pulled.workers
        self.live_workers = pulled.live_workers
        self.archived_counts = handlers.archived_counts
        # PulledJobs
        self.claim_pulled = pulled.claim_pulled
        self.renew_pulled = pulled.renew_pulled
        self.existing_jobs = pulled.existing_jobs
        self.cancelled_jobs = pulled.cancelled_jobs
        self.complete_pulled = pulled.complete_pulled
        self.archive_pulled = pulled.archive_pulled
        self.hand_back = pulled.hand_back
        self.done_among = pulled.done_among
        self.daemons = pulled.daemons
        # ScheduleStore
        self.put_schedule = schedules.put_schedule
        self.list_schedules = schedules.list_schedules
        self.delete_schedule = schedules.delete_schedule
        self.claim_schedules = schedules.claim_schedules
        self.next_schedule_due = schedules.next_schedule_due
        self.record_ticks = schedules.record_ticks
        self.defer_ticks = schedules.defer_ticks

    @property
    def on_resolved(self) -> Callable[[Resolution], None] | None:
        """Told of every resolution of dependents (the queue log and metrics)."""
        return self.graph.on_resolved

    @on_resolved.setter
    def on_resolved(self, told: Callable[[Resolution], None] | None) -> None:
        self.graph.on_resolved = told

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        idle_close: float = 300.0,
        migrate: bool = True,
        connect_timeout: float = 5.0,
        command_timeout: float = 30.0,
    ) -> Self:
        """Open a pool on ``dsn`` and, unless ``migrate`` is False, apply migrations.

        Connections beyond ``min_size`` open when needed; one unused for
        ``idle_close`` seconds closes (0: never)."""
        pool = await open_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            idle_close=idle_close,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
        )
        store = cls(pool, acquire_timeout=connect_timeout + command_timeout, dsn=dsn)
        if migrate:
            try:
                await store.db.migrate()
            except BaseException:
                await store.close()
                raise
        return store

"""``PgStore``: the ``queue_daemon.store.ports.Store`` on PostgreSQL through an asyncpg pool,
made of one part per concern of the ports (see ``store/ports.py``)."""

from __future__ import annotations

from queue_daemon.store.pg_graph import GraphPart
from queue_daemon.store.pg_handlers import HandlersPart
from queue_daemon.store.pg_jobs import JobsPart
from queue_daemon.store.pg_pulled import PulledPart
from queue_daemon.store.pg_queue import QueuePart
from queue_daemon.store.pg_schedules import SchedulesPart
from queue_daemon.store.pg_tenants import TenantsPart

__all__ = ["PgStore"]


class PgStore(JobsPart, QueuePart, PulledPart, GraphPart, TenantsPart, HandlersPart, SchedulesPart):
    """The job store on PostgreSQL.

    Every call takes a connection from the pool and returns it; asyncpg errors
    leave as ``queue_daemon.store.errors`` (``StoreUnavailable`` when the server cannot be
    reached). The pool replaces dead connections on its own, so the first call
    after PostgreSQL comes back works without any reconnect by the caller.
    """

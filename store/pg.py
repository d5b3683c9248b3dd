"""``PgStore``: the ``store.ports.Store`` on PostgreSQL through an asyncpg pool,
made of one part per concern of the ports (see ``store/ports.py``)."""

from __future__ import annotations

from store.pg_graph import GraphPart
from store.pg_handlers import HandlersPart
from store.pg_jobs import JobsPart
from store.pg_pulled import PulledPart
from store.pg_queue import QueuePart
from store.pg_schedules import SchedulesPart
from store.pg_tenants import TenantsPart

__all__ = ["PgStore"]


class PgStore(JobsPart, QueuePart, PulledPart, GraphPart, TenantsPart, HandlersPart, SchedulesPart):
    """The job store on PostgreSQL.

    Every call takes a connection from the pool and returns it; asyncpg errors
    leave as ``store.errors`` (``StoreUnavailable`` when the server cannot be
    reached). The pool replaces dead connections on its own, so the first call
    after PostgreSQL comes back works without any reconnect by the caller.
    """

"""An in-memory store implementing every port of ``queue_daemon.store.ports``
(``FakeStore``), with the semantics of ``queue_daemon.store.pg.PgStore`` that the
engine relies on, proven by the contract suite in ``tests/contract`` (run
against both): eligible means ``lock == ''`` and ``dt <= now``; a claim takes
the oldest due first up to its limit, leases, and counts an attempt; releases
retry, unget or archive; expired leases unlock; adds are idempotent by id;
dependencies block and are resolved; and so on for tenants, handlers, sysids,
pull workers, schedules and the dashboard.

One module per part, as in ``store/``: ``tables`` (the rows and what every part
shares: the clock, archiving, resolving dependents), ``jobs`` (JobIntake,
JobQueries), ``queue`` (JobQueue, SysidLeases), ``pulled`` (PulledJobs),
``tenants`` (TenantStore), ``handlers`` (HandlerStore, Dashboard),
``schedules`` (ScheduleStore).
"""

from tests.fakes.store.store import FakeStore
from tests.fakes.store.tables import DONE, Row

__all__ = ["DONE", "FakeStore", "Row"]

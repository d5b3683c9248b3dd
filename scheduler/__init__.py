"""Which jobtype runs next: fair between tenants, then between a tenant's types.

Pure logic, no I/O: the daemon tells it what is waiting and what started or stopped.
"""

from scheduler.cpu import busy_tenants
from scheduler.errors import SchedulerError
from scheduler.models import Pick, tenant_of
from scheduler.scheduler import Scheduler

__all__ = ["Pick", "Scheduler", "SchedulerError", "busy_tenants", "tenant_of"]

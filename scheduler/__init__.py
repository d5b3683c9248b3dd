"""Which jobtype runs next: fair between tenants, then between a tenant's types.

Pure logic, no I/O: the daemon tells it what is waiting and what started or stopped.
"""

from queue_daemon.scheduler.cpu import busy_tenants
from queue_daemon.scheduler.errors import SchedulerError
from queue_daemon.scheduler.models import Pick
from queue_daemon.scheduler.scheduler import Scheduler

__all__ = ["Pick", "Scheduler", "SchedulerError", "busy_tenants"]

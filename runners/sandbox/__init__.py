"""The sandbox: how a handler process is started and walled off.

| module       | holds                                                                 |
|--------------|-----------------------------------------------------------------------|
| jail         | ``Sandbox``: starts handler processes under all of the below          |
| walls        | bubblewrap's view and the seccomp filter, probed, and their argv      |
| view         | the minimal view: what a handler sees of the machine (bubblewrap)     |
| syscalls     | the system calls handlers may not make (libseccomp's filter)          |
| wrappers     | the exec wrappers for uids, namespaces, cgroups and the protocol fds  |
| rlimits      | ``ProcessLimits``: each handler process's resource limits             |
| bootstraps   | the language bootstraps, copied where handlers can read them          |
| users        | who handlers run as (a uid per tenant as root, or the run-as user)    |
| process      | a handler's process: exit seen at once, its whole tree killed         |
| probes       | what the machine offers (unshare, ip, python) and the scrubbed env    |
| cgroups      | a cgroup v2 per context or shell job, killed as a whole               |
| cpushare     | the handlers' CPU groups: a group per tenant, busy tenants' marks     |
| cpuplace     | the daemon's own CPU group and its real-time hold (``--realtime``)    |
| addresses    | the address policy of ``http`` handlers                               |
| workdirs     | private working directories under the work root                      |

Only this package touches cgroups and scheduling classes.
"""

from queue_daemon.runners.sandbox.jail import Sandbox
from queue_daemon.runners.sandbox.probes import SAFE_PATH, scrubbed_env
from queue_daemon.runners.sandbox.process import Child, describe_exit, kill_group
from queue_daemon.runners.sandbox.rlimits import ProcessLimits
from queue_daemon.runners.sandbox.users import RunAs, TenantUids, resolve_run_as, tenant_ids

__all__ = [
    "SAFE_PATH",
    "Child",
    "ProcessLimits",
    "RunAs",
    "Sandbox",
    "TenantUids",
    "describe_exit",
    "kill_group",
    "resolve_run_as",
    "scrubbed_env",
    "tenant_ids",
]

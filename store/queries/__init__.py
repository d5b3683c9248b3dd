"""Every SQL statement the store runs, with ``$n`` parameters: one module per
concern of the ports (``store/ports.py``), reached as ``queries.<module>.<NAME>``.

Tenant scoping is always done here, in SQL: ``split_part(type, '-', 1) = $client``
matches the expression index ``jobs_client_created_idx`` of the waiting,
blocked and done rows of ``jobs`` (a client name never contains ``-``, so
``a`` never sees ``ab``'s jobs). STATS scopes by the range
``type >= $client || '-' AND type < $client || '.'`` on the C-collated type
instead, the same set, so that it can read the partial indexes and type_counts.
"""

from queue_daemon.store.queries import (
    blobs,
    counts,
    dashboard,
    graph,
    handlers,
    intake,
    jobs,
    migrations,
    pulled,
    queue,
    release,
    schedules,
    sysids,
    tenants,
)

__all__ = [
    "blobs",
    "counts",
    "dashboard",
    "graph",
    "handlers",
    "intake",
    "jobs",
    "migrations",
    "pulled",
    "queue",
    "release",
    "schedules",
    "sysids",
    "tenants",
]

"""Which tenants are busy on the CPU: they run more contexts at once than their share.

A running batch is one context process, which keeps at most about one core
busy. A tenant's share is the cores divided among the tenants that have a
batch running, and never less than one context: a tenant running one batch at
a time is never busy. The daemon puts busy tenants' handlers behind the others'
when a handler wakes (``queue_daemon.runners.sandbox.cpushare``), so a flooding tenant's contexts
do not delay another tenant's job by a time slice each; the other tenants run
at most their share between them, so busy tenants still get theirs. When
every tenant with a batch running is over its share, none is busy: there is
no one for them to yield to, and marked busy they would also wait behind
every other process on the machine (``queue_daemon.runners.sandbox.cpushare``).
"""

from __future__ import annotations

from collections.abc import Mapping


def busy_tenants(batches: Mapping[str, int], cores: int) -> frozenset[str]:
    """The tenants whose running ``batches`` exceed their share of ``cores``."""
    active = [tenant for tenant, n in batches.items() if n > 0]
    if not active:
        return frozenset()
    share = max(1, cores // len(active))
    busy = frozenset(tenant for tenant in active if batches[tenant] > share)
    return busy if len(busy) < len(active) else frozenset()

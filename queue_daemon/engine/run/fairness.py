"""What keeps one tenant from taking the daemon: a cap on the runner contexts a
tenant's batches may hold, and the busy marks sent to the runners.

The scheduler shares slots fairly, but a batch also holds a runner context,
and those are fewer (``max_parallel_batches``). One tenant may hold at most
all but ``RESERVED_BATCHES_SHARE`` of them, so a flood of slow jobs cannot
take every context: another tenant's job still gets one at once (and keeps
its warm context instead of a cold start per job).

A tenant that ran more contexts at once than its share of the cores since the
last check is busy (``queue_daemon.scheduler.busy_tenants``): its handlers are put behind
the others' on the CPU. Pure: the clock is passed in.
"""

from __future__ import annotations

from queue_daemon.scheduler import busy_tenants

RESERVED_BATCHES_SHARE = 8  # 1/8: 8 of the default 64


class TenantBatches:
    """Batches claiming or running per tenant, and the most at once since the last
    busy check."""

    def __init__(self, max_parallel_batches: int) -> None:
        parallel = max_parallel_batches
        self.cap = max(1, parallel - max(1, parallel // RESERVED_BATCHES_SHARE))
        self._batches: dict[str, int] = {}
        self._peak: dict[str, int] = {}

    def started(self, tenant: str) -> None:
        batches = self._batches[tenant] = self._batches.get(tenant, 0) + 1
        if batches > self._peak.get(tenant, 0):
            self._peak[tenant] = batches

    def ended(self, tenant: str) -> None:
        left = self._batches.get(tenant, 0) - 1
        if left > 0:
            self._batches[tenant] = left
        else:
            self._batches.pop(tenant, None)

    def full(self) -> set[str]:
        """Tenants at their cap: their other jobs wait for one of their batches to end."""
        return {tenant for tenant, n in self._batches.items() if n >= self.cap}

    def take_peak(self) -> dict[str, int]:
        """The most batches each tenant held at once since the last call."""
        peak, self._peak = self._peak, dict(self._batches)
        return peak


class BusyMarks:
    """Which tenants to mark busy, and when to send the marks again: at every check
    while any tenant is busy and for ``remark_s`` after (the runners' real-time hold
    ends with the last re-mark), and whenever the busy set changes."""

    def __init__(self, cores: int, remark_s: float) -> None:
        self.cores = cores
        self.remark_s = remark_s
        self.busy: frozenset[str] = frozenset()
        self._seen = -remark_s  # when a tenant was last busy

    def check(self, peak: dict[str, int], now: float) -> frozenset[str] | None:
        """The busy tenants to send now, or None when nothing is to be sent."""
        busy = busy_tenants(peak, self.cores)
        if busy:
            self._seen = now
        if busy != self.busy or now - self._seen < self.remark_s:
            self.busy = busy
            return busy
        return None

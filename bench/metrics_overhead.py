"""``python -m bench.metrics_overhead``: what the metrics cost on the hot paths.

In-process timing of the calls an add request and a finished batch make
(``Metrics.added`` + ``add_took``; ``claimed``, ``ran``, ``finished``), next to
the time one request takes at the measured add rates (docs/benchmark.md), so the share
is plain. No daemon, no store: the calls touch neither.
"""

from __future__ import annotations

import time

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.observe.metrics import Metrics

ROUNDS = 200_000
ONE_LINE_REQUEST_S = 1 / 5000  # ~5k 1-line adds/s (docs/benchmark.md)
BATCH_REQUEST_S = 1000 / 250_000  # 1000-line adds at ~250k jobs/s


def _per_call(step: object, rounds: int) -> float:
    assert callable(step)
    began = time.perf_counter()
    for _ in range(rounds):
        step()
    return (time.perf_counter() - began) / rounds


def main() -> None:
    metrics = Metrics(metrics_tenants=100, metrics_types=200)
    clients = [f"t{i}" for i in range(50)]

    state = {"i": 0}

    def add() -> None:
        i = state["i"] = state["i"] + 1
        metrics.added(clients[i % 50], "resize", 1000)
        metrics.add_took(0.0012)

    releases = [
        Release(id=str(i), how=ReleaseHow.ARCHIVE, code="ok" if i % 10 else "failed")
        for i in range(200)
    ]

    def batch() -> None:
        metrics.claimed("t1-resize", 200, 0.004)
        metrics.ran("python", 0.1)
        metrics.finished("t1-resize", releases)

    add_s = _per_call(add, ROUNDS)
    batch_s = _per_call(batch, ROUNDS // 10)
    print(f"add request: {add_s * 1e6:.2f} us (one count of n, one histogram observation)")
    print(f"  share of a 1-line add at 5k req/s:        {add_s / ONE_LINE_REQUEST_S:.2%}")
    print(f"  share of a 1000-line add at 250k jobs/s:  {add_s / BATCH_REQUEST_S:.3%}")
    print(f"batch of 200 (claim + run + finish): {batch_s * 1e6:.2f} us per batch")
    print(f"  per job: {batch_s / 200 * 1e9:.0f} ns")
    render = _per_call(metrics.render, 200)
    print(f"render of the exposition ({len(metrics.render())} bytes): {render * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

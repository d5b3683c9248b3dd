"""Jobs archived per second, per stored jobtype, over the last minutes.

Every daemon samples the store's monotonic archive counters
(``type_counts.archived``, migration 0006) every ``step`` seconds and keeps
the samples of the last ``window`` seconds in memory. The counters are shared
by every daemon on the store, so any daemon's samples give the whole store's
throughput, whoever ran the jobs; a daemon that just started has no history
yet, and fills it as it samples.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable

from store.errors import StoreError
from store.ports import Dashboard

logger = logging.getLogger(__name__)

STEP_S = 5.0
WINDOW_S = 600.0
RECENT_S = 60.0  # the span of the "jobs/s now" figure


class Throughput:
    """Samples of ``{stored type: jobs ever archived}`` and the rates between them."""

    def __init__(
        self,
        *,
        step: float = STEP_S,
        window: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.step = step
        self.window = window
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, int]]] = deque(maxlen=int(window / step) + 1)

    def add(self, counts: dict[str, int], at: float | None = None) -> None:
        self._samples.append((self._clock() if at is None else at, counts))

    def series(self, stored_type: str) -> list[float]:
        """Jobs/s of ``stored_type`` between consecutive samples, oldest first
        (one point fewer than samples). A type missing from a sample had no
        archived job yet (its counter row appears with the first one)."""
        points: list[float] = []
        for (t0, c0), (t1, c1) in itertools.pairwise(self._samples):
            elapsed = t1 - t0
            done = c1.get(stored_type, 0) - c0.get(stored_type, 0)
            points.append(round(max(done, 0) / elapsed, 2) if elapsed > 0 else 0.0)
        return points

    def recent(self, stored_type: str, span: float = RECENT_S) -> float | None:
        """Mean jobs/s over about the last ``span`` seconds; None before two samples."""
        if len(self._samples) < 2:
            return None
        t1, c1 = self._samples[-1]
        t0, c0 = self._samples[0]
        for at, counts in reversed(self._samples):
            t0, c0 = at, counts
            if t1 - at >= span:
                break
        if t1 <= t0:
            return None
        done = c1.get(stored_type, 0) - c0.get(stored_type, 0)
        return round(max(done, 0) / (t1 - t0), 2)

    async def run(self, store: Dashboard) -> None:
        """Sample until cancelled; a store outage leaves a gap, never stops the loop
        (the rate across a gap is spread over its real length)."""
        while True:
            try:
                self.add(await store.archived_counts())
            except StoreError as exc:
                logger.warning(
                    "throughput not sampled: %s", exc, extra={"action": "throughput_sample_failed"}
                )
            await asyncio.sleep(self.step)

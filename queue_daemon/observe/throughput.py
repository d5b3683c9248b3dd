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

from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import Dashboard

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
        self._ends_key: tuple[int, float, float] | None = None
        self._ends: tuple[tuple[float, dict[str, int]], tuple[float, dict[str, int]]] | None = None
        self._zeros: list[float] = []

    def add(self, counts: dict[str, int], at: float | None = None) -> None:
        self._samples.append((self._clock() if at is None else at, counts))

    def of(self, stored_type: str) -> tuple[float | None, list[float]]:
        """``recent`` and ``series`` of ``stored_type`` at once; for an idle type (no
        job archived over the whole window, most types of a big store) without
        reading the samples between."""
        if len(self._samples) >= 2:
            first, last = self._samples[0][1], self._samples[-1][1]
            if first.get(stored_type, 0) == last.get(stored_type, 0):
                idle = self._idle_series()
                return (None if self._span_ends(RECENT_S) is None else 0.0), idle
        return self.recent(stored_type), self.series(stored_type)

    def _idle_series(self) -> list[float]:
        """All zeros, one point fewer than samples: one list shared by every idle
        type of an overview (it is only read, to be encoded)."""
        n = len(self._samples) - 1
        if len(self._zeros) != n:
            self._zeros = [0.0] * n
        return self._zeros

    def series(self, stored_type: str) -> list[float]:
        """Jobs/s of ``stored_type`` between consecutive samples, oldest first
        (one point fewer than samples). A type missing from a sample had no
        archived job yet (its counter row appears with the first one)."""
        if len(self._samples) < 2:
            return []
        first, last = self._samples[0][1], self._samples[-1][1]
        if first.get(stored_type, 0) == last.get(stored_type, 0):
            # the counters only grow: an idle type (most of them) is all zeros
            return [0.0] * (len(self._samples) - 1)
        points: list[float] = []
        for (t0, c0), (t1, c1) in itertools.pairwise(self._samples):
            elapsed = t1 - t0
            done = c1.get(stored_type, 0) - c0.get(stored_type, 0)
            points.append(round(max(done, 0) / elapsed, 2) if elapsed > 0 else 0.0)
        return points

    def recent(self, stored_type: str, span: float = RECENT_S) -> float | None:
        """Mean jobs/s over about the last ``span`` seconds; None before two samples."""
        ends = self._span_ends(span)
        if ends is None:
            return None
        (t0, c0), (t1, c1) = ends
        done = c1.get(stored_type, 0) - c0.get(stored_type, 0)
        return round(max(done, 0) / (t1 - t0), 2)

    def _span_ends(
        self, span: float
    ) -> tuple[tuple[float, dict[str, int]], tuple[float, dict[str, int]]] | None:
        """The samples that bound the last ``span`` seconds (found once per sample
        and span: an overview asks for every type it lists)."""
        key = (len(self._samples), self._samples[-1][0] if self._samples else 0.0, span)
        if self._ends_key == key:
            return self._ends
        self._ends_key, self._ends = key, None
        if len(self._samples) >= 2:
            last = self._samples[-1]
            first = self._samples[0]
            for sample in reversed(self._samples):
                first = sample
                if last[0] - sample[0] >= span:
                    break
            if last[0] > first[0]:
                self._ends = (first, last)
        return self._ends

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

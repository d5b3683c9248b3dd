"""``Lanes``: threads that run a plain (not async) function on jobs taken from
one queue, for the ``Worker``.

A job costs no task, future or thread hand-off of its own: a lane takes the
next job as soon as it finishes one, and results go back to the event loop in
bursts (one wake-up for all that finished meanwhile). Lanes grow one at a
time, only while jobs wait and no lane is free, up to ``size`` (the worker's
concurrency): quick functions are run by a few lanes, slow ones by as many
as may run at once. A lane idle for ``IDLE_S`` ends.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

IDLE_S = 10.0

J = TypeVar("J")


class Lanes(Generic[J]):
    def __init__(
        self,
        size: int,
        function: Callable[[J], Any],
        finished: Callable[[list[tuple[J, Any, BaseException | None]]], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.size = size
        self._function = function
        self._finished = finished  # called on the loop with (job, value, exception) each
        self._loop = loop
        self._jobs: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._lanes = 0
        self._free = 0  # lanes waiting for a job, or starting
        self._results: collections.deque[tuple[J, Any, BaseException | None]] = collections.deque()
        self._wake_sent = False
        self._closed = False

    def put(self, jobs: list[J]) -> None:
        for job in jobs:
            self._jobs.put(job)
        self._grow()

    def take_waiting(self) -> list[J]:
        """The jobs no lane has started (for a stop: they are handed back)."""
        taken: list[J] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return taken
            if job is not None:
                taken.append(job)

    def close(self) -> None:
        """Lanes end once their job is done (a job still running is not waited for)."""
        with self._lock:
            self._closed = True
            lanes = self._lanes
        for _ in range(lanes):
            self._jobs.put(None)

    def _grow(self) -> None:
        with self._lock:
            if self._closed or self._free > 0 or self._lanes >= self.size:
                return
            self._lanes += 1
            self._free += 1
        threading.Thread(target=self._lane, name="worker-lane", daemon=True).start()

    def _lane(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                job = None
            with self._lock:
                if job is None and not self._closed and not self._jobs.empty():
                    continue  # a job came as this lane was about to end
                if job is None:  # idle, or closed
                    self._lanes -= 1
                    self._free -= 1
                    return
                self._free -= 1
            if not self._jobs.empty():
                self._grow()  # more wait and this lane is busy now
            try:
                value, error = self._function(job), None
            except Exception as exc:
                value, error = None, exc
            self._results.append((job, value, error))
            with self._lock:
                self._free += 1
                wake = not self._wake_sent
                self._wake_sent = True
            if wake:
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody waits for results
                    return

    def _deliver(self) -> None:
        with self._lock:
            self._wake_sent = False
        done: list[tuple[J, Any, BaseException | None]] = []
        while self._results:
            done.append(self._results.popleft())
        if done:
            self._finished(done)

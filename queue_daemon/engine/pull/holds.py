"""Requests held until something happens in the store, woken by its notifications
on every daemon: a pull worker's claim waiting for a job of its type
(``JobWaits``), and ``GET /job/{id}?wait=`` waiting for a job to be done
(``DoneWaits``).

Notifications can be missed (a listener reconnecting) and some changes send
none (a delayed job coming due, a lease expiring on another daemon, a cancel),
so every waiter also looks again at least every ``RECHECK_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping

from queue_daemon.store.errors import StoreError

logger = logging.getLogger(__name__)

RECHECK_S = 1.0


class JobWaits:
    """Claims waiting for jobs of a stored jobtype."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self.closed = False

    async def wait(self, jobtype: str, seconds: float) -> None:
        """Return when jobs of ``jobtype`` may have come, or after ``seconds``."""
        if self.closed or seconds <= 0:
            return
        event = asyncio.Event()
        waiters = self._waiters.setdefault(jobtype, set())
        waiters.add(event)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await event.wait()
        finally:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(jobtype, None)

    def on_jobs(self, added: Mapping[str, int] | None) -> None:
        """The store's note of jobs added: due ones per jobtype, None for any."""
        if not self._waiters:
            return
        types: Collection[str] = list(self._waiters) if added is None else added
        for jobtype in types:
            for event in self._waiters.get(jobtype, ()):
                event.set()

    def close(self) -> None:
        """Wake every waiter and wait no more (the daemon stops)."""
        self.closed = True
        self.on_jobs(None)


class DoneWaits:
    """Requests waiting for jobs to be done; one store read for all of them
    each time a note names their type, and at least every ``RECHECK_S``."""

    def __init__(self, done_among: Callable[[list[str]], Awaitable[set[str]]]) -> None:
        self._done_among = done_among
        self._waiters: dict[str, tuple[str, set[asyncio.Event]]] = {}  # id -> (type, events)
        self._due: set[str] = set()  # stored types named by notes since the last check
        self._all_due = False
        self._wake = asyncio.Event()
        self.closed = False

    async def wait(self, job_id: str, jobtype: str, seconds: float) -> None:
        """Return when job ``job_id`` (of stored ``jobtype``) may be done, or after
        ``seconds``."""
        if self.closed or seconds <= 0:
            return
        event = asyncio.Event()
        _, events = self._waiters.setdefault(job_id, (jobtype, set()))
        events.add(event)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await event.wait()
        finally:
            events.discard(event)
            if not events:
                self._waiters.pop(job_id, None)

    def on_done(self, types: set[str] | None) -> None:
        if not self._waiters:
            return
        if types is None:
            self._all_due = True
        else:
            self._due |= types
        self._wake.set()

    async def run(self) -> None:
        """Check the waited-on jobs when told and every ``RECHECK_S``, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_S):
                    await self._wake.wait()
            self._wake.clear()
            due, self._due = self._due, set()
            timed_out = not self._all_due and not due
            if self._all_due or timed_out:
                ids = list(self._waiters)
            else:
                ids = [i for i, (t, _) in self._waiters.items() if t in due]
            self._all_due = False
            if not ids:
                continue
            try:
                done = await self._done_among(ids)
            except StoreError as exc:
                logger.warning("done check failed: %s", exc, extra={"action": "done_wait"})
                continue
            for job_id in done:
                for event in self._waiters.get(job_id, (None, set()))[1]:
                    event.set()

    def close(self) -> None:
        self.closed = True
        for _, events in self._waiters.values():
            for event in events:
                event.set()

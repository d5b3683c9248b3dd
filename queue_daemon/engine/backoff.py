"""Delays that grow while something keeps failing: the one backoff of the daemon's
retry loops (claims, releases, ingestion, connecting to the store, listening)."""

from __future__ import annotations

import asyncio
import random


class Backoff:
    """``first``, then twice as long each time up to ``cap``; ``reset()`` after a
    success. With ``jitter`` each delay is drawn from half to one and a half times
    itself, so daemons that failed together do not retry together."""

    def __init__(self, first: float, cap: float, *, jitter: bool = False) -> None:
        if not 0 < first <= cap:
            raise ValueError("a backoff needs 0 < first <= cap")
        self.first = first
        self.cap = cap
        self.jitter = jitter
        self._delay = first

    def next(self) -> float:
        """The delay before the next try."""
        delay = self._delay
        self._delay = min(delay * 2, self.cap)
        return delay * (0.5 + random.random()) if self.jitter else delay

    def reset(self) -> None:
        self._delay = self.first

    async def sleep(self) -> None:
        await asyncio.sleep(self.next())

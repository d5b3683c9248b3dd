"""The clock of a batch's running job: one timer per batch, not a task per frame.

Every frame of the batch moves the deadline on (``move``); the timer, when it
fires early, sets itself again for the deadline, and once the deadline has
passed calls ``expire`` (the context kills its process tree; its read loop then
sees the end of the stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class JobDeadline:
    """The deadline of the job running in one context."""

    __slots__ = ("_at", "_expire", "_loop", "_timer", "timed_out")

    def __init__(self, expire: Callable[[], None]) -> None:
        self._expire = expire
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0
        self.timed_out = False  # the deadline passed (and ``expire`` was called)

    def start(self, seconds: float) -> None:
        """A batch begins: its first job has ``seconds``."""
        self._loop = asyncio.get_running_loop()
        self.timed_out = False
        self._at = self._loop.time() + seconds
        self._timer = self._loop.call_at(self._at, self._check)

    def move(self, seconds: float) -> None:
        """The running job (or the next one) has ``seconds`` from now."""
        assert self._loop is not None
        self._at = self._loop.time() + seconds

    def pause(self) -> None:
        """Stop the clock while the daemon, not the job, takes the time."""
        if self._timer is not None:
            self._timer.cancel()

    def resume(self, seconds: float) -> None:
        """Run the clock again, the job having ``seconds`` from now."""
        assert self._loop is not None
        self._at = self._loop.time() + seconds
        self._timer = self._loop.call_at(self._at, self._check)

    def stop(self) -> None:
        """The batch ended (or its context stopped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        assert self._loop is not None
        if self._loop.time() + 0.001 < self._at:
            self._timer = self._loop.call_at(self._at, self._check)
            return
        self.timed_out = True
        self._expire()

"""Running jobs the store cancelled, as this daemon heard of them (``qd_cancel``).

A notice may come before the claim that took the job has returned here (the
cancel waited on the claim's row lock and commits right after it), so it is
kept for a while (``keep`` seconds, about a lease) and looked at when a batch
starts, as well as acted on at once for a batch that runs."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterable

MOST = 100_000  # notices kept at most (each a job id): a flood of cancels is bounded


class Cancels:
    def __init__(self, keep: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep = keep
        self._clock = clock
        self._heard: dict[str, float] = {}  # job id -> when heard (monotonic), oldest first

    def hear(self, job_id: str) -> None:
        now = self._clock()
        heard = self._heard
        heard.pop(job_id, None)  # heard again: the newest
        while heard:
            oldest = next(iter(heard))
            if now - heard[oldest] < self._keep and len(heard) < MOST:
                break
            del heard[oldest]
        heard[job_id] = now

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._heard

    def forget(self, ids: Iterable[str]) -> None:
        if self._heard:
            for job_id in ids:
                self._heard.pop(job_id, None)


def started(task: asyncio.Task[None]) -> bool:
    """Whether the task's coroutine has begun: one cancelled before its first
    step never runs at all (not even its ``finally``)."""
    coro = task.get_coro()
    return not inspect.iscoroutine(coro) or inspect.getcoroutinestate(coro) != inspect.CORO_CREATED

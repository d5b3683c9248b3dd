"""The daemon's background tasks, each named, none whose failure nobody sees."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)


class Tasks:
    """The daemon's background tasks: a failure is logged and stops the daemon,
    never lost (the engine's periodic services have a supervisor of their own,
    ``engine.upkeep.supervisor``, which is one of these tasks)."""

    def __init__(self, on_failure: Callable[[], None]) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_failure = on_failure

    def start(self, name: str, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error(
                "background task %s failed",
                task.get_name(),
                exc_info=exc,
                extra={"action": "task_failed", "task": task.get_name()},
            )
            self._on_failure()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

"""The one supervisor of the daemon's periodic services (the upkeep of the store
and the run loop's busy marks): starts them in order, runs each one's step
every so often, and stops them in the reverse order.

A step that fails because the store is away is logged and tried again at the
next interval, as the store comes back. Any other failure is a bug: it is
logged with the service's name and surfaced (``run`` raises it, and the
daemon's task supervisor stops the daemon), never lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from queue_daemon.store.errors import StoreError

logger = logging.getLogger(__name__)


class Service(Protocol):
    """A periodic service: ``step`` every ``every`` seconds, the first ``first``
    seconds after the start."""

    @property
    def name(self) -> str: ...

    @property
    def every(self) -> float: ...

    @property
    def first(self) -> float: ...

    async def step(self) -> None: ...


class ServiceFailed(Exception):
    """A service's step raised something other than a store error."""

    def __init__(self, name: str) -> None:
        super().__init__(f"service {name} failed")
        self.name = name


class Supervisor:
    """Runs ``services`` (in their start order) until cancelled or one fails."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services = list(services)

    async def run(self) -> None:
        """Every service, until cancelled (then each stops, the last started
        first) or until one fails (ServiceFailed, from the failure; the others
        stop as when cancelled)."""
        tasks: list[asyncio.Task[None]] = []
        try:
            for service in self.services:
                task = asyncio.create_task(_every(service), name=f"upkeep-{service.name}")
                tasks.append(task)
                logger.debug("started %s", service.name, extra={"action": "service_started"})
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # raises the failure
        finally:
            await _stop(tasks)


async def _every(service: Service) -> None:
    wait = service.first
    while True:
        await asyncio.sleep(wait)
        wait = service.every
        try:
            await service.step()
        except StoreError as exc:
            logger.warning(
                "%s failed: %s",
                service.name,
                exc,
                extra={"action": "service_step", "service": service.name},
            )
        except Exception as exc:
            logger.exception(
                "service %s failed",
                service.name,
                extra={"action": "service_failed", "service": service.name},
            )
            raise ServiceFailed(service.name) from exc


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel and await each task, the last started first."""
    try:
        for task in reversed(tasks):
            task.cancel()
            await asyncio.wait([task])
    finally:
        for task in tasks:  # the stop itself was cancelled: the rest stop too
            task.cancel()

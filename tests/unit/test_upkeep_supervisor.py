"""The supervisor of the periodic services (``engine.upkeep.supervisor``): each
service's step every so often, a store error logged and tried again, any other
failure logged and surfaced, and the services stopped in reverse order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from queue_daemon.engine.run.batch import DEADLINE_GRACE_S
from queue_daemon.engine.upkeep.deadlines import DeadlineSettings
from queue_daemon.engine.upkeep.supervisor import ServiceFailed, Supervisor
from queue_daemon.store.errors import StoreUnavailable


class Steps:
    """A service whose step is ``act`` (called with the step's number)."""

    def __init__(
        self, name: str, act: Callable[[int], object] = lambda n: None, *, every: float = 0.001
    ) -> None:
        self.name = name
        self.every = every
        self.first = 0.0
        self.steps = 0
        self._act = act

    async def step(self) -> None:
        self.steps += 1
        self._act(self.steps)


class Blocks:
    """A service whose first step blocks until it is stopped, noting both."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.every = self.first = 0.0
        self._log = log

    async def step(self) -> None:
        self._log.append(f"start {self.name}")
        try:
            await asyncio.Event().wait()
        finally:
            self._log.append(f"stop {self.name}")


async def until(check: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def test_a_failing_service_is_logged_and_surfaced_and_the_others_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(n: int) -> None:
        if n == 3:
            raise RuntimeError("a bug")

    log: list[str] = []
    supervisor = Supervisor([Blocks("steady", log), Steps("broken", broken)])
    with caplog.at_level(logging.ERROR), pytest.raises(ServiceFailed) as failed:
        await asyncio.wait_for(supervisor.run(), 5)
    assert failed.value.name == "broken"
    assert isinstance(failed.value.__cause__, RuntimeError)
    (record,) = [r for r in caplog.records if getattr(r, "action", None) == "service_failed"]
    assert getattr(record, "service", None) == "broken" and record.exc_info is not None
    assert log == ["start steady", "stop steady"]


async def test_a_store_error_is_logged_and_the_step_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def away(n: int) -> None:
        if n <= 2:
            raise StoreUnavailable("the store is restarting")

    service = Steps("flaky", away)
    task = asyncio.create_task(Supervisor([service]).run())
    try:
        with caplog.at_level(logging.WARNING):
            await until(lambda: service.steps >= 4, "the steps after the store came back")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    warned = [r for r in caplog.records if getattr(r, "action", None) == "service_step"]
    assert len(warned) == 2 and all(getattr(r, "service", None) == "flaky" for r in warned)
    assert task.cancelled()


async def test_services_start_in_order_and_stop_in_reverse() -> None:
    log: list[str] = []
    supervisor = Supervisor([Blocks(name, log) for name in ("renew", "expire", "purge")])
    task = asyncio.create_task(supervisor.run())
    await until(lambda: len(log) == 3, "every service to start")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert log == [
        "start renew",
        "start expire",
        "start purge",
        "stop purge",
        "stop expire",
        "stop renew",
    ]


def test_a_batch_is_stopped_only_after_the_deadline_check_has_ended_its_job() -> None:
    """The run loop stops a batch a moment after its soonest deadline, once the
    upkeep's check (which ends that job, 408) has had its turn."""
    assert DeadlineSettings().every < DEADLINE_GRACE_S

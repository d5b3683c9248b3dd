"""``FakeStore``: every port of ``queue_daemon.store.ports.Store`` in memory."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tests.fakes.store.blobs import Blobs
from tests.fakes.store.jobs import Jobs
from tests.fakes.store.pulled import Pulled
from tests.fakes.store.schedules import Schedules


class FakeStore(Jobs, Pulled, Blobs, Schedules):
    """The store in memory, with PostgreSQL's semantics where the engine relies on
    them (``tests/contract`` runs the same tests against both). One call is one
    transaction: nothing else runs while it does, so a claim is exclusive as
    ``FOR UPDATE SKIP LOCKED`` makes it, and ``now`` is read once per call as
    ``now()`` is once per statement.

    Failures can be injected per method (``fail``: how many calls raise
    ``StoreUnavailable``), and every call is counted (``calls``)."""

    def __init__(self, now: Callable[[], datetime] | None = None) -> None:
        super().__init__()
        if now is not None:
            self.now = now

    async def close(self) -> None:
        self._call("close")

    async def ping(self) -> None:
        self._call("ping")

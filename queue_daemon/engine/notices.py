"""The store's notices, each told to every part that waits on it: new jobs (the
run loop's claims, the pull workers' held claims), a handler's change (the run
loop), done jobs (held GETs) and cancelled running jobs (the run loop)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from queue_daemon.engine.backoff import Backoff
from queue_daemon.store.ports import JobQueue

LISTEN_RETRY_FIRST_S = 0.1  # reconnecting the store's listener, doubling
LISTEN_RETRY_MAX_S = 5.0

OnJobs = Callable[[dict[str, int] | None], None]
OnHandler = Callable[[str], None]
OnDone = Callable[[set[str] | None], None]
OnCancel = Callable[[str, str], None]


class Notices:
    """Tells each notice to its listeners, in the order given."""

    def __init__(
        self,
        *,
        jobs: Sequence[OnJobs],
        handlers: Sequence[OnHandler] = (),
        done: Sequence[OnDone] = (),
        cancels: Sequence[OnCancel] = (),
    ) -> None:
        self._jobs = tuple(jobs)
        self._handlers = tuple(handlers)
        self._done = tuple(done)
        self._cancels = tuple(cancels)

    def on_jobs(self, added: dict[str, int] | None = None) -> None:
        """New jobs: ``added`` counts the due ones per jobtype; None when it is not
        known what changed."""
        for told in self._jobs:
            told(added)

    def on_handler(self, jobtype: str) -> None:
        for told in self._handlers:
            told(jobtype)

    def on_done(self, jobtypes: set[str] | None) -> None:
        for told in self._done:
            told(jobtypes)

    def on_cancel(self, sysid: str, job_id: str) -> None:
        """A running job was cancelled: the daemon ``sysid`` stops it."""
        for told in self._cancels:
            told(sysid, job_id)

    async def listen(self, store: JobQueue) -> None:
        """Hear the store's notices until cancelled (the store reconnects)."""
        retry = Backoff(LISTEN_RETRY_FIRST_S, LISTEN_RETRY_MAX_S)
        on_done = self.on_done if self._done else None
        on_cancel = self.on_cancel if self._cancels else None
        await store.listen(
            self.on_jobs, self.on_handler, retry=retry, on_done=on_done, on_cancel=on_cancel
        )

"""``Worker``: runs a function on the jobs of a pulled type, from any machine
that can reach a daemon (docs/client.md).

It claims in batches with a held claim (one request waits for jobs), runs
the function on each job with at most ``concurrency`` at once (an async
function on the event loop, a plain one in ``Lanes``), renews the claims of
the jobs it holds at a third of their lease, and completes them in batches.
On SIGTERM or SIGINT (or ``stop()``) it claims no more, hands back the jobs
not started, lets the running ones finish within ``grace`` seconds, hands
back the ones that did not (they wait again at once, their attempt not
counted), sends the last completes and returns. A daemon that cannot be
reached is tried again with a growing delay; a computed result is sent
again while its job's lease may hold. The jobs of a claim answered as late as
their lease (``lease_s``) after it was sent are not run: another worker may
hold them by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from queue_daemon.client.client import Client, backoff
from queue_daemon.client.errors import QueueError
from queue_daemon.client.job import Job, failure, jobs_of, lease_seconds, outcome
from queue_daemon.client.lanes import Lanes
from queue_daemon.client.reports import MAX_ITEMS, Reports

logger = logging.getLogger(__name__)

Function = Callable[[Job], Any]


class Worker(Reports):
    """Runs ``function`` on the jobs of the pulled ``type``: ``await worker.run()``.

    ``queue`` is a ``Client``, or a daemon's URL with ``client`` and ``token``
    (the worker then opens its own ``Client`` and closes it when ``run`` returns).
    """

    def __init__(
        self,
        queue: Client | str,
        type: str,
        function: Function,
        *,
        client: str | None = None,
        token: str | None = None,
        name: str | None = None,
        concurrency: int = 16,
        batch: int = 100,
        wait: float = 20.0,
        grace: float = 30.0,
        flush_after: float = 0.005,
    ) -> None:
        if not 1 <= batch <= MAX_ITEMS or concurrency < 1:
            raise ValueError(f"batch must be 1 to {MAX_ITEMS} and concurrency at least 1")
        if isinstance(queue, str):
            if client is None:
                raise ValueError("a Worker given a URL needs client= (and token=)")
            queue = Client(queue, client, token)
            self._own_client = True
        else:
            self._own_client = False
        self.client = queue
        self.type = type
        self.function = function
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"[:100]
        self.concurrency = concurrency
        self.batch = batch
        self.wait = wait
        self.grace = grace
        self.flush_after = flush_after
        self._is_async = inspect.iscoroutinefunction(function)
        # claimed and not yet finished: a task each for an async function; a plain
        # one's jobs go to threads (``Lanes``) that take one after another
        self._running: dict[str, tuple[Job, asyncio.Task[None] | None]] = {}
        self._emptied = asyncio.Event()
        self._room = asyncio.Event()
        # (lease end, complete item): an item whose lease has passed is no longer sent
        self._done: list[tuple[float, dict[str, Any]]] = []
        self._sending: list[tuple[float, dict[str, Any]]] = []  # the complete in flight
        self._lanes: Lanes[Job] | None = None
        self._to_flush = asyncio.Event()
        self._stopping = asyncio.Event()
        self._closing = False  # the last flush: the flusher sends what is left and ends
        self._lease = 60.0
        self.completed = 0  # jobs whose completes the daemon took
        self.lost = 0  # jobs whose claim no longer held them when renewed or completed
        self.cancelled = 0  # jobs stopped because they were cancelled while running

    def stop(self) -> None:
        """Stop claiming; ``run`` returns once the running jobs are finished or handed back."""
        self._stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Claim and run jobs until ``stop()`` (or SIGTERM / SIGINT)."""
        loop = asyncio.get_running_loop()
        signals = handle_signals and threading.current_thread() is threading.main_thread()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        if not self._is_async:
            self._lanes = Lanes(self.concurrency, self._in_lane, self._finished, loop)
        flusher = asyncio.create_task(self._flush_loop())
        renewer = asyncio.create_task(self._renew_loop())
        for task in (flusher, renewer):
            task.add_done_callback(self._background_ended)
        try:
            await self._claim_loop()
            await self._finish()
        finally:
            if self._lanes is not None:
                # a function still running past the grace is not waited for
                self._lanes.close()
            renewer.cancel()
            [renewed] = await asyncio.gather(renewer, return_exceptions=True)
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            # not cancelled: a complete cut off on its way could not tell what it did
            self._closing = True
            self._to_flush.set()
            try:
                await flusher  # sends what is left, then ends
            finally:
                if self._own_client:
                    await self.client.close()
            if isinstance(renewed, Exception):
                raise renewed

    def _background_ended(self, task: asyncio.Task[None]) -> None:
        """A completes or renewals loop that fails stops the worker (``run`` raises it)."""
        if not task.cancelled() and task.exception() is not None:
            logger.error("worker %s: %s failed; stopping", self.name, task.get_coro())
            self.stop()

    # --- claiming -------------------------------------------------------------

    async def _claim_loop(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            free = self.concurrency - len(self._running)
            if free <= 0:
                self._room.clear()
                await self._first(self._room.wait())
                continue
            sent = time.monotonic()
            claim = asyncio.ensure_future(
                self.client.claim(self.type, self.name, limit=min(self.batch, free), wait=self.wait)
            )
            if not await self._first(claim):
                # the held claim is abandoned: the daemon hands back what it takes
                # for a client that went away
                with contextlib.suppress(asyncio.CancelledError, QueueError):
                    await claim
                return
            try:
                items = claim.result()
            except QueueError as exc:
                delay = backoff(attempt)
                attempt += 1
                logger.warning("claim failed (%s); again in %.1f s", exc, delay)
                await self._first(asyncio.sleep(delay))
                continue
            attempt = 0
            items = in_time(items, time.monotonic() - sent)
            if items:
                self._start(jobs_of(items))

    async def _first(self, awaitable: Awaitable[Any]) -> bool:
        """Await ``awaitable`` unless a stop comes first (then it is cancelled);
        False when the stop came first."""
        task = asyncio.ensure_future(awaitable)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if task.done():
            return True
        task.cancel()
        return False

    def _start(self, jobs: list[Job]) -> None:
        self._lease = lease_seconds(jobs[-1])
        self._emptied.clear()
        if self._lanes is not None:
            for job in jobs:
                self._running[job.id] = (job, None)
            self._lanes.put(jobs)
            return
        for job in jobs:
            self._running[job.id] = (job, asyncio.create_task(self._run_one(job)))

    async def _run_one(self, job: Job) -> None:
        try:
            value = await self.function(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._finished([(job, None, exc)])
        else:
            self._finished([(job, value, None)])

    def _finished(self, done: list[tuple[Job, Any, BaseException | None]]) -> None:
        """Results of jobs (on the event loop): queued for the next complete."""
        for job, value, error in done:
            self._result(job, value, error)
        self._to_flush.set()
        self._room.set()
        if not self._running:
            self._emptied.set()

    def _result(self, job: Job, value: Any, error: BaseException | None) -> None:
        entry = self._running.get(job.id)
        if entry is None or entry[0] is not job:
            return  # handed back meanwhile (or claimed again): not ours to give
        del self._running[job.id]
        if job._cancelled:
            return  # cancelled while it ran: the daemon takes no outcome
        if error is None and value is not None and inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            error = TypeError("the function returned an awaitable: make it an async def")
        exitcode, result = outcome(value) if error is None else failure(error)
        item: dict[str, Any] = {"id": job.id, "claim": job.claim, "exitcode": exitcode}
        if result is not None:
            item["result"] = result
        if job._emits:
            item["jobs"] = job._emits
        self._done.append((job._lease_end, item))

    def _in_lane(self, job: Job) -> Any:
        """A plain function's run, in a lane's thread; not run for a job
        cancelled while it waited for a lane (its result is dropped anyway)."""
        return None if job._cancelled else self.function(job)

    def _cancelled(self, job_id: str) -> None:
        """The job was cancelled while held: an async function's task is
        cancelled; a plain function, run in a thread, cannot be stopped: it keeps
        its lane (and its place in ``concurrency``) until it returns, and its
        result is dropped, as is that of one that had not started yet."""
        entry = self._running.get(job_id)
        if entry is None or entry[0]._cancelled:
            return
        job, task = entry
        logger.info("job %s was cancelled: stopping it", job_id)
        job._cancelled = True
        self.cancelled += 1
        if task is not None:
            del self._running[job_id]
            task.cancel()
            self._room.set()
            if not self._running:
                self._emptied.set()

    async def _finish(self) -> None:
        """After a stop: hand back the jobs not started, let the running ones finish
        within ``grace``, hand back the rest."""
        back = self._lanes.take_waiting() if self._lanes is not None else []
        for job in back:
            self._running.pop(job.id, None)
        await self._release(back)
        if self._running:
            self._emptied.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), self.grace)
        left = list(self._running.values())
        self._running.clear()
        for _, task in left:
            if task is not None:
                task.cancel()  # an async function stops; a thread's result is dropped
        await self._release([job for job, _ in left])

    async def _release(self, jobs: list[Job]) -> None:
        claims = [{"id": job.id, "claim": job.claim} for job in jobs]
        for start in range(0, len(claims), MAX_ITEMS):
            try:
                await self.client.release_many(self.name, claims[start : start + MAX_ITEMS])
            except QueueError as exc:
                logger.warning("hand-back failed (%s): the jobs wait for their lease", exc)


def in_time(items: list[dict[str, Any]], waited: float) -> list[dict[str, Any]]:
    """The claimed jobs whose lease still holds after a claim answered ``waited``
    seconds after it was sent: a daemon stopped between its claim and its answer
    (a SIGSTOP, a long pause) answers after the lease, when another worker may
    run the jobs already. The lease began after the claim was sent, so this
    errs on the safe side, whatever the clocks of the two machines say. Those
    left out are not run here; their lease runs out and another claim takes them."""
    late = [item for item in items if waited >= float(item.get("lease_s", float("inf")))]
    if not late:
        return items
    logger.warning(
        "a claim answered %.1f s after it was sent, past the lease of %d job(s): not run here",
        waited,
        len(late),
    )
    return [item for item in items if waited < float(item.get("lease_s", float("inf")))]

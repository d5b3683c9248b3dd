"""What a ``Worker`` tells the daemon of the jobs it holds (docs/client.md): their
completes, sent in batches as results come, and the renewals of their claims at
a third of their lease, with the progress its function reported. Part of the
``Worker`` (``queue_daemon.client.worker``): the state it reads is the worker's."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from queue_daemon.client.client import Client, backoff
from queue_daemon.client.errors import QueueError
from queue_daemon.client.job import Job, epoch, sendable

logger = logging.getLogger("queue_daemon.client.worker")

MAX_ITEMS = 1000  # jobs per claim, complete, renew or hand-back request
RENEW_TICK = 0.2  # seconds between looks at whether claims are due for renewal
LEASE_SLACK = 5.0  # seconds a complete is still tried past its lease (clocks differ a little)


class Reports:
    """The worker's completes and renewals (``Worker`` is one of these)."""

    # the worker's, set by its __init__
    client: Client
    name: str
    flush_after: float
    completed: int
    lost: int
    cancelled: int
    _running: dict[str, tuple[Job, asyncio.Task[None] | None]]
    # (lease end, complete item): an item whose lease has passed is no longer sent
    _done: list[tuple[float, dict[str, Any]]]
    _sending: list[tuple[float, dict[str, Any]]]  # the complete in flight
    _to_flush: asyncio.Event
    _closing: bool
    _lease: float

    def _cancelled(self, job_id: str) -> None: ...

    async def _flush_loop(self) -> None:
        while not self._closing:
            await self._to_flush.wait()
            if not self._closing:
                await asyncio.sleep(self.flush_after)  # a few more join the batch
            self._to_flush.clear()
            await self._flush_all()

    async def _flush_all(self) -> None:
        attempt = 0
        while self._done:
            held, self._done = self._done[:MAX_ITEMS], self._done[MAX_ITEMS:]
            held = self._newest_per_job(held)
            self._sending = held  # renewed meanwhile, in place (see _renew_loop)
            try:
                try:
                    answers = await self.client.complete_many(self.name, [i for _, i in held])
                finally:
                    self._sending = []
            except TypeError:  # orjson: a result or follow-on payload that is not JSON
                self._done[:0] = [(end, sendable(item)) for end, item in held]
                continue
            except QueueError as exc:
                # kept and sent again (a claim token makes that safe) while the lease may
                # still hold; past it the job is another worker's, or waits for one
                now = time.time() - LEASE_SLACK
                self._done[:0] = [(end, i) for end, i in held if end > now]
                for _, item in (h for h in held if h[0] <= now):
                    self.lost += 1
                    logger.warning(
                        "job %s: lease ran out before the daemon took its complete", item["id"]
                    )
                delay = backoff(attempt)
                attempt += 1
                logger.warning("complete failed (%s); again in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            for answer in answers:
                if answer["status"] == 200:
                    self.completed += 1
                elif answer.get("reason") == "cancelled":
                    self.cancelled += 1
                    logger.info("job %s was cancelled: its outcome is dropped", answer["id"])
                else:
                    self.lost += 1
                    logger.warning("job %s: %s", answer["id"], answer.get("message"))

    def _newest_per_job(
        self, held: list[tuple[float, dict[str, Any]]]
    ) -> list[tuple[float, dict[str, Any]]]:
        """One result per job: a job claimed again while the complete of its earlier
        claim could not be sent (the daemon was down past the lease) has a result
        for each claim. Only the newest claim may still hold it, and the daemon
        refuses a request that names a job twice, so the older results go."""
        newest = {item["id"]: k for k, (_, item) in enumerate(held)}
        if len(newest) == len(held):
            return held
        kept = []
        for k, (end, item) in enumerate(held):
            if newest[item["id"]] == k:
                kept.append((end, item))
            else:
                self.lost += 1
                logger.warning("job %s: claimed again; its earlier result is dropped", item["id"])
        return kept

    async def _renew_loop(self) -> None:
        # a tick, not a sleep of a third of the lease: the lease is learnt from the
        # first claim, after this loop started (a first sleep of a third of the
        # default 60 s let shorter leases run out before their first renewal)
        last = time.monotonic()
        while True:
            await asyncio.sleep(RENEW_TICK)
            if time.monotonic() - last < max(RENEW_TICK, self._lease / 3):
                continue
            last = time.monotonic()
            running = {job.id: job for job, _ in self._running.values()}
            # results not yet taken (the daemon or its store is unreachable) hold
            # their claims too: renewed, they are not run again elsewhere meanwhile
            held = {item["id"]: item["claim"] for _, item in self._sending + self._done}
            held.update((job.id, job.claim) for job in running.values())
            claims: list[dict[str, Any]] = []
            for job_id, claim in held.items():
                job = running.get(job_id)
                report = None if job is None else job._progress
                item = {"id": job_id, "claim": claim}
                claims.append(item if report is None else {**item, "progress": report})
                if job is not None:
                    job._progress = None  # sent once: a renewal after it says nothing new
            renewed: dict[tuple[str, str], float] = {}
            for start in range(0, len(claims), MAX_ITEMS):
                try:
                    answers = await self.client.renew_many(
                        self.name, claims[start : start + MAX_ITEMS]
                    )
                except QueueError as exc:
                    logger.warning("renew failed: %s", exc)
                    continue
                for answer in answers:
                    job_id = answer["id"]
                    if answer["status"] == 200 and answer.get("lease_until"):
                        renewed[(job_id, held[job_id])] = epoch(answer["lease_until"])
                        job = running.get(job_id)
                        if job is not None:
                            job._lease_end = renewed[(job_id, job.claim)]
                    elif answer.get("reason") == "cancelled":
                        self._cancelled(job_id)
                    elif answer["status"] != 200:
                        logger.warning(
                            "job %s is no longer held: %s", job_id, answer.get("message")
                        )
            for entries in (self._sending, self._done):
                for k, (end, item) in enumerate(entries):
                    entries[k] = (renewed.get((item["id"], item["claim"]), end), item)

"""The queue's client library: ``Client`` (jobs, handlers, waiting for results)
and ``Worker`` (runs a function on the jobs of a pulled type from any machine).

It needs only aiohttp, httptools and orjson: importing it loads none of the daemon.

    from queue_daemon.client import Client, Worker

    async def resize(job):
        return f"resized {job.payload}"

    async with Client("http://queue:8080", "acme", token) as q:
        await Worker(q, "resize", resize).run()
"""

from queue_daemon.client.client import Client
from queue_daemon.client.discovery import discover
from queue_daemon.client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    QueueError,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from queue_daemon.client.job import Job, outcome
from queue_daemon.client.worker import Worker

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "Job",
    "NotFound",
    "QueueError",
    "RateLimited",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "discover",
    "outcome",
]

"""The client library's pure decisions: what a function's return means, the
retry delays, and which error replies are exceptions of which kind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queue_daemon.client import Conflict, NotFound, QueueError, RateLimited, Unavailable, outcome
from queue_daemon.client.client import backoff, nothing_done
from queue_daemon.client.errors import error_of
from queue_daemon.client.job import Job, failure
from queue_daemon.client.worker import Worker, in_time


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (200, None)),
        (404, (404, None)),
        (150, (150, None)),
        ("done", (200, "done")),
        ("", (200, "")),
        ((422, "bad size"), (422, "bad size")),
        ([503, "later"], (503, "later")),
        ({"w": 1}, (200, {"w": 1})),
        (True, (200, True)),  # a bool is a value, not exitcode 1
        ((True, "x"), (200, (True, "x"))),
        ((1, 2, 3), (200, (1, 2, 3))),
    ],
)
def test_a_return_value_is_an_exitcode_and_a_result(value: object, expected: object) -> None:
    assert outcome(value) == expected


def test_an_exception_is_a_500_with_its_last_traceback_line() -> None:
    try:
        raise ValueError("cannot resize boom")
    except ValueError as exc:
        assert failure(exc) == (500, "ValueError: cannot resize boom")


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    for attempt in range(40):
        base = min(5.0, 0.1 * 2.0**attempt)
        delays = [backoff(attempt) for _ in range(200)]
        assert all(0.5 * base <= d <= 1.5 * base for d in delays), (attempt, min(delays))
        assert len(set(delays)) > 1, "jittered: workers do not come back in step"
    assert max(backoff(1000, 0.05, 1.0) for _ in range(100)) <= 1.5


def test_error_replies_become_exceptions_with_status_kind_and_message() -> None:
    missing = error_of(404, {"error": "not_found", "message": "no such job"})
    assert isinstance(missing, NotFound) and isinstance(missing, QueueError)
    assert (missing.status, missing.kind, missing.message) == (404, "not_found", "no such job")
    assert isinstance(error_of(409, {"error": "conflict", "message": "m"}), Conflict)
    limited = error_of(429, {"error": "rate_limited", "message": "m"}, "2.5")
    assert isinstance(limited, RateLimited) and limited.retry_after == 2.5
    assert isinstance(error_of(429, None, "soon"), RateLimited)
    odd = error_of(502, b"<html>")
    assert type(odd) is QueueError and odd.status == 502 and odd.kind == "error"


def test_only_replies_that_say_nothing_was_done_are_safe_to_send_again() -> None:
    assert nothing_done(error_of(429, {"error": "rate_limited", "message": "m"}))
    assert nothing_done(error_of(503, {"error": "unavailable", "message": "journal"}))
    assert not nothing_done(Unavailable(0, "unreachable", "connection reset"))
    assert not nothing_done(error_of(503, None))  # a proxy's page: passed on, perhaps
    assert not nothing_done(error_of(500, {"error": "internal", "message": "m"}))


def test_a_job_gives_its_payload_as_text_and_json_and_keeps_its_follow_ons() -> None:
    job = Job(
        {
            "id": "j-1",
            "type": "resize",
            "payload": '{"path": "a.jpg"}',
            "attempts": 2,
            "lease_until": "2030-01-01T00:00:00+00:00",
            "claim": "c1",
        }
    )
    assert job.json() == {"path": "a.jpg"} and job.payload == '{"path": "a.jpg"}'
    assert job.attempt == job.attempts == 2
    job.emit("thumbnail", {"of": "a.jpg"})
    assert job._emits == [{"type": "thumbnail", "payload": {"of": "a.jpg"}}]
    assert job._lease_end == pytest.approx(1893456000.0)


def _item(job_id: str, lease_s: float | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": job_id, "type": "t", "payload": "p", "attempts": 1}
    item.update(lease_until="2026-11-26T12:00:00.000000Z", claim="c")
    if lease_s is not None:
        item["lease_s"] = lease_s
    return item


def test_jobs_whose_claim_answered_after_their_lease_are_not_run() -> None:
    items = [_item("a", 4.0), _item("b", 60.0), _item("old-daemon", None)]
    assert in_time(items, 1.0) is items  # in time: nothing copied
    assert [i["id"] for i in in_time(items, 5.5)] == ["b", "old-daemon"]
    assert [i["id"] for i in in_time(items, 60.0)] == ["old-daemon"]


Items = list[dict[str, Any]]


class LateClaims:
    """A Client whose first claim answers after its jobs' lease (its daemon was
    stopped between the claim and the answer); later claims find nothing."""

    def __init__(self) -> None:
        self.claims = 0

    async def claim(self, type: str, worker: str, *, limit: int = 1, wait: float = 0) -> Items:
        self.claims += 1
        if self.claims == 1:
            await asyncio.sleep(0.2)
            return [_item("late", 0.1), _item("fine", 30.0)]
        await asyncio.sleep(0.01)
        return []

    async def complete_many(self, worker: str, results: Items) -> Items:
        return [{"id": r["id"], "status": 200} for r in results]

    async def renew_many(self, worker: str, claims: Items) -> Items:
        return [{"id": c["id"], "status": 200} for c in claims]

    async def release_many(self, worker: str, claims: Items) -> Items:
        return [{"id": c["id"], "status": 200} for c in claims]


async def test_a_worker_does_not_run_the_jobs_of_a_late_claim_answer() -> None:
    ran: list[str] = []
    done = asyncio.Event()

    async def function(job: Job) -> None:
        ran.append(job.id)
        done.set()

    worker = Worker(LateClaims(), "t", function, name="w", wait=0)  # type: ignore[arg-type]
    running = asyncio.create_task(worker.run(handle_signals=False))
    await asyncio.wait_for(done.wait(), 5)
    worker.stop()
    await asyncio.wait_for(running, 5)
    assert ran == ["fine"]

"""The client library against a small HTTP server that misbehaves on purpose
(real sockets, real aiohttp): which requests are sent again after a 503, a
429 or a lost connection, ``wait`` against a daemon that does not hold GETs,
and a Worker whose complete is lost on the way or refused for one job."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from queue_daemon.client import Client, Job, Unavailable, Worker

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Fake:
    """One route table, every request counted by path; ``connect`` serves it."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.seen: list[str] = []
        self.server: TestServer | None = None
        self.clients: list[Client] = []

    def route(self, method: str, path: str, handler: Handler) -> None:
        async def counted(request: web.Request) -> web.StreamResponse:
            self.seen.append(request.path)
            return await handler(request)

        self.app.router.add_route(method, path, counted)

    def count(self, path: str) -> int:
        return self.seen.count(path)

    async def connect(self, retry_for: float = 2.0) -> Client:
        self.server = TestServer(self.app)
        await self.server.start_server()
        q = Client(str(self.server.make_url("")), "t", "tok", retry_for=retry_for)
        self.clients.append(q)
        return q

    async def close(self) -> None:
        for q in self.clients:
            await q.close()
        if self.server is not None:
            await self.server.close()


@pytest.fixture
async def served() -> AsyncIterator[Fake]:
    fake = Fake()
    try:
        yield fake
    finally:
        await fake.close()


def _error(status: int, kind: str, **headers: str) -> web.Response:
    return web.json_response({"error": kind, "message": kind}, status=status, headers=headers)


def _drop(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()  # the connection is lost before any reply
    return web.Response()


async def test_an_add_is_sent_again_after_503_and_429_but_not_after_a_lost_reply(
    served: Fake,
) -> None:
    replies = [_error(503, "unavailable"), _error(429, "rate_limited", **{"Retry-After": "0.05"})]

    async def add(request: web.Request) -> web.StreamResponse:
        if request.match_info["type"] == "lost":
            return _drop(request)
        return replies.pop(0) if replies else web.json_response({"ids": ["i-1"]})

    served.route("POST", "/t/job/{type}/add", add)
    q = await served.connect()
    assert await q.add("ok", "x") == ["i-1"]
    assert served.count("/t/job/ok/add") == 3, "503 unavailable and 429: nothing was added"
    with pytest.raises(Unavailable):
        await q.add("lost", "x")
    assert served.count("/t/job/lost/add") == 1, "no key: a lost reply may have added it"
    with pytest.raises(Unavailable):
        await q.add("lost", "x", idempotency_key="k")
    assert served.count("/t/job/lost/add") > 2, "with a key the same add is safe to repeat"


async def test_wait_polls_with_backoff_a_daemon_that_does_not_hold_gets(
    served: Fake,
) -> None:
    answers = {"n": 0}

    async def get(request: web.Request) -> web.StreamResponse:
        answers["n"] += 1
        if answers["n"] <= 2:
            return _error(404, "not_found")  # not yet in the store
        state = "done" if answers["n"] >= 6 else "running"
        return web.json_response({"id": "j-1", "state": state, "result": "r"})

    served.route("GET", "/t/job/{id}", get)
    q = await served.connect()
    loop = asyncio.get_running_loop()
    began = loop.time()
    job = await q.wait("j-1", timeout=30)
    assert job["state"] == "done" and answers["n"] == 6
    assert loop.time() - began > 0.2, "answered at once each time, yet polled without a pause"


async def test_a_worker_sends_a_lost_complete_again_and_drops_a_refused_one(
    served: Fake,
) -> None:
    lease = "2100-01-01T00:00:00+00:00"
    jobs = [
        {
            "id": f"j-{n}",
            "type": "w",
            "payload": "p",
            "attempts": 1,
            "lease_until": lease,
            "claim": f"c{n}",
        }
        for n in (1, 2)
    ]
    sent: list[list[dict[str, Any]]] = []
    settled = asyncio.Event()

    async def claim(request: web.Request) -> web.StreamResponse:
        if served.count("/t/job/w/claim") == 1:
            return web.json_response({"jobs": jobs})
        await asyncio.sleep(0.05)
        return web.json_response({"jobs": []})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sent.append(body["results"])
        if len(sent) == 1:
            return _drop(request)
        if sum(len(s) for s in sent[1:]) >= 2:
            settled.set()
        results = [
            {"id": r["id"], "status": 200 if r["id"] == "j-1" else 409} for r in body["results"]
        ]
        return web.json_response({"results": results})

    served.route("POST", "/t/job/w/claim", claim)
    served.route("POST", "/t/jobs/complete", complete)
    q = await served.connect()

    def work(job: Job) -> tuple[int, str]:
        return 201, job.id

    worker = Worker(q, "w", work, batch=10, wait=1)
    running = asyncio.create_task(worker.run(handle_signals=False))
    await asyncio.wait_for(settled.wait(), 30)
    worker.stop()
    await asyncio.wait_for(running, 30)
    assert worker.completed == 1 and worker.lost == 1
    again = [r for s in sent[1:] for r in s]
    assert sorted(r["id"] for r in again) == ["j-1", "j-2"], "the lost complete was sent again"
    assert all(r["exitcode"] == 201 and r["result"] == r["id"] for r in again)


async def test_a_job_claimed_again_before_its_complete_got_through_is_completed_once(
    served: Fake,
) -> None:
    """The first complete is lost while the job's lease runs out and the same worker
    claims it again: its next complete names the job once, with the newer claim (the
    daemon answers 400 to a request that names a job twice)."""
    job = {"id": "j-1", "type": "w", "payload": "p", "attempts": 1}
    lease = "2100-01-01T00:00:00+00:00"
    claimed_again = asyncio.Event()
    sent: list[list[dict[str, Any]]] = []
    settled = asyncio.Event()

    async def claim(request: web.Request) -> web.StreamResponse:
        calls = served.count("/t/job/w/claim")
        if calls <= 2:
            if calls == 2:
                claimed_again.set()
            return web.json_response(
                {"jobs": [{**job, "attempts": calls, "lease_until": lease, "claim": f"c{calls}"}]}
            )
        await asyncio.sleep(0.05)
        return web.json_response({"jobs": []})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sent.append(body["results"])
        if len(sent) == 1:
            await asyncio.wait_for(claimed_again.wait(), 10)
            return _drop(request)
        ids = [r["id"] for r in body["results"]]
        if len(ids) != len(set(ids)):
            return _error(400, "bad_request")
        settled.set()
        return web.json_response({"results": [{"id": i, "status": 200} for i in ids]})

    served.route("POST", "/t/job/w/claim", claim)
    served.route("POST", "/t/jobs/complete", complete)
    q = await served.connect()

    def work(job: Job) -> str:
        return f"attempt {job.attempt}"

    worker = Worker(q, "w", work, batch=10, wait=1)
    running = asyncio.create_task(worker.run(handle_signals=False))
    await asyncio.wait_for(settled.wait(), 30)
    worker.stop()
    await asyncio.wait_for(running, 30)
    last = sent[-1]
    assert [(r["id"], r["claim"], r["result"]) for r in last] == [("j-1", "c2", "attempt 2")], sent
    assert worker.completed == 1 and worker.lost == 1


async def test_a_worker_renews_the_claim_of_a_result_it_cannot_send_yet(served: Fake) -> None:
    """The daemon answers 503 to completes for longer than the lease: the worker's
    renewals keep the finished job's claim, so its complete is taken afterwards
    instead of the job being run again elsewhere."""
    lease_s = 1.0
    lease_end = time.time() + lease_s
    outage_end: float | None = None
    renewed_after_run: list[str] = []
    ran = asyncio.Event()
    settled = asyncio.Event()
    answers: list[int] = []

    def until_iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat()

    async def claim(request: web.Request) -> web.StreamResponse:
        if served.count("/t/job/w/claim") == 1:
            item = {"id": "j-1", "type": "w", "payload": "p", "attempts": 1, "claim": "c1"}
            return web.json_response({"jobs": [{**item, "lease_until": until_iso(lease_end)}]})
        await asyncio.sleep(0.05)
        return web.json_response({"jobs": []})

    async def renew(request: web.Request) -> web.StreamResponse:
        nonlocal lease_end
        body = await request.json()
        results = []
        for item in body["claims"]:
            if time.time() < lease_end:
                lease_end = time.time() + lease_s
                results.append(
                    {"id": item["id"], "status": 200, "lease_until": until_iso(lease_end)}
                )
                if ran.is_set():
                    renewed_after_run.append(item["id"])
            else:
                results.append({"id": item["id"], "status": 409, "message": "lapsed"})
        return web.json_response({"results": results})

    async def complete(request: web.Request) -> web.StreamResponse:
        nonlocal outage_end
        body = await request.json()
        if outage_end is None:
            outage_end = time.time() + 3 * lease_s
        if time.time() < outage_end:
            return _error(503, "unavailable")
        status = 200 if time.time() < lease_end else 409  # a lapsed claim is refused
        answers.append(status)
        settled.set()
        return web.json_response(
            {"results": [{"id": r["id"], "status": status} for r in body["results"]]}
        )

    served.route("POST", "/t/job/w/claim", claim)
    served.route("POST", "/t/jobs/renew", renew)
    served.route("POST", "/t/jobs/complete", complete)
    q = await served.connect()

    def work(job: Job) -> str:
        ran.set()
        return "done"

    worker = Worker(q, "w", work, batch=10, wait=1)
    running = asyncio.create_task(worker.run(handle_signals=False))
    await asyncio.wait_for(settled.wait(), 30)
    worker.stop()
    await asyncio.wait_for(running, 30)
    assert answers == [200], answers
    assert "j-1" in renewed_after_run, "the finished job's claim was not renewed"
    assert worker.completed == 1 and worker.lost == 0

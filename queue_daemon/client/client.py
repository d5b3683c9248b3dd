"""``Client``: a tenant's async view of a daemon over HTTP (docs/client.md).

Only aiohttp, httptools and orjson: importing it loads none of the daemon (no
store, journal or runners), so it runs on any machine that can reach a daemon.
Requests go through the client's own keep-alive connections
(``queue_daemon.client.transport``), or through an aiohttp session when one
is given.

Retries (with a growing, jittered delay, up to ``retry_for`` seconds): a
``429`` and the daemon's own ``503 unavailable`` mean nothing was done, so
every request is sent again after them (after ``Retry-After`` for a 429).
A lost connection (or a 503 from something in between) leaves it unknown
whether the daemon acted: reads, claims, renewals, completes and hand-backs
are sent again, since sending one twice changes nothing (a claim's token
guards the others); an add only with an ``idempotency_key``, and a cancel or
a handler's delete not at all: the error is raised for the caller to decide.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson

from queue_daemon.client.errors import (
    NotFound,
    QueueError,
    RateLimited,
    Unavailable,
    error_of,
)
from queue_daemon.client.transport import Transport, TransportError

MAX_WAIT_S = 60.0  # the longest a daemon holds a claim or a GET
JSONish = Any


def nothing_done(exc: QueueError) -> bool:
    """Whether the daemon said it did nothing: 429, or its own ``503 unavailable``
    (not a lost connection, nor a 503 from a proxy that may have passed the request on)."""
    return exc.status == 429 or (exc.status == 503 and exc.kind == "unavailable")


def backoff(attempt: int, first: float = 0.1, cap: float = 5.0) -> float:
    """The delay before try ``attempt`` (0-based): doubling from ``first`` up to
    ``cap``, drawn from half to one and a half times that."""
    grown: float = first * 2.0 ** min(attempt, 30)
    return min(cap, grown) * (0.5 + random.random())


class Client:
    """``async with Client(url, client, token) as q: ids = await q.add("resize", ["a"])``"""

    def __init__(
        self,
        url: str,
        client: str,
        token: str | None,
        *,
        session: aiohttp.ClientSession | None = None,
        retry_for: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.client = client
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = session  # a caller's aiohttp session: used instead of _transport
        self._transport: Transport | None = None
        self.retry_for = retry_for

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def _http(self) -> Transport:
        if self._transport is None:
            self._transport = Transport(self.url, read_timeout=MAX_WAIT_S + 30)
        return self._transport

    # --- the one request path -------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: JSONish = None,
        data: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        retry: bool = True,
        raw: bool = False,
    ) -> Any:
        """``method`` on ``/{client}{path}`` (``path`` from the root when it starts
        with ``//``); the JSON reply, or a ``QueueError``. With ``retry`` False only
        the replies that say nothing was done are retried. ``raw``: the reply's
        bytes, not JSON."""
        target = path[1:] if path.startswith("//") else f"/{self.client}{path}"
        sent = {**self._headers, **(headers or {})}
        if json is not None:
            data = orjson.dumps(json)
            sent.setdefault("Content-Type", "application/json")
        deadline = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            try:
                return await self._once(method, target, data, params, sent, raw)
            except (Unavailable, RateLimited) as exc:
                if not (retry or nothing_done(exc)) or time.monotonic() >= deadline:
                    raise
                delay = exc.retry_after if isinstance(exc, RateLimited) else backoff(attempt)
            attempt += 1
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))

    async def _once(
        self,
        method: str,
        target: str,
        data: bytes | None,
        params: dict[str, str] | None,
        headers: dict[str, str],
        raw: bool = False,
    ) -> Any:
        try:
            if self._session is not None:
                async with self._session.request(
                    method, self.url + target, data=data, params=params, headers=headers
                ) as reply:
                    read = await reply.read()
                    status = reply.status
                    retry_after = reply.headers.get("Retry-After")
            else:
                response = await self._http().request(
                    method, target, headers=headers, body=data, params=params
                )
                read, status = response.body, response.status
                retry_after = response.headers.get("retry-after")
        except (aiohttp.ClientError, TransportError, TimeoutError, OSError) as exc:
            where = f"{self.url}{target}: {type(exc).__name__}: {exc}"
            raise Unavailable(0, "unreachable", where) from None
        if raw and status == 200:
            return read
        try:
            body = orjson.loads(read) if read else None
        except orjson.JSONDecodeError:
            body = None
        if status != 200:
            raise error_of(status, body, retry_after)
        return body

    # --- jobs -------------------------------------------------------------------

    async def add(
        self,
        type: str,
        payloads: JSONish,
        *,
        delay: float | None = None,
        dt: str | int | None = None,
        idempotency_key: str | None = None,
        after: Sequence[str] = (),
        requires: str | None = None,
        deadline: float | str | None = None,
        priority: int | None = None,
        key: str | None = None,
        json: bool | None = None,
    ) -> list[str]:
        """Add one job (a string, or any JSON value) or many (a list: one request,
        all or nothing); their ids, in order. Strings go as text lines unless
        ``json`` is True; any other value as JSON (stored as compact JSON).
        ``priority`` (-100 to 100, default 0): among due jobs of the type, a
        higher one runs first. ``key``: the jobs' concurrency key (1 to 200
        printable characters); a handler's ``keyConcurrency`` caps how many
        jobs of one key run at once."""
        items = payloads if isinstance(payloads, list) else [payloads]
        as_json = json if json is not None else not all(isinstance(i, str) for i in items)
        params: dict[str, str] = {}
        if delay is not None:
            params["delay"] = f"{delay:g}"
        if dt is not None:
            params["dt"] = str(dt)
        if after:
            params["after"] = ",".join(after)
        if requires is not None:
            params["requires"] = requires
        if deadline is not None:
            params["deadline"] = str(deadline)
        if priority is not None:
            params["priority"] = str(priority)
        if key is not None:
            params["key"] = key
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        if as_json:
            body = orjson.dumps(items)
            headers["Content-Type"] = "application/json"
        else:
            body = "\n".join(items).encode()
            headers["Content-Type"] = "text/plain"
        reply = await self.request(
            "POST",
            f"/job/{type}/add",
            data=body,
            params=params,
            headers=headers,
            retry=idempotency_key is not None,
        )
        ids: list[str] = reply["ids"]
        return ids

    async def get(self, job_id: str, *, wait: float | None = None) -> dict[str, Any]:
        """The job; with ``wait`` (at most 60 s) held until it is done or ``wait`` passes."""
        params = None if wait is None else {"wait": f"{min(wait, MAX_WAIT_S):g}"}
        job: dict[str, Any] = await self.request("GET", f"/job/{job_id}", params=params)
        return job

    async def wait(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        """The job once it is done (held GETs; a job not yet in the store is looked
        for again). TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            left = MAX_WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} not done within {timeout:g} s")
            asked = min(left, MAX_WAIT_S)
            began = time.monotonic()
            try:
                job = await self.get(job_id, wait=asked)
            except NotFound:  # acknowledged, perhaps, and not yet in the store
                job = None
            if job is not None and job["state"] == "done":
                return job
            if job is None or time.monotonic() - began < asked / 2:
                # not there yet, or a daemon that does not hold a GET: poll, slower and slower
                left = asked - (time.monotonic() - began)
                await asyncio.sleep(min(backoff(attempt, 0.05, 2.0), max(left, 0.0)))
                attempt += 1

    async def list(
        self,
        *,
        type: str | None = None,
        state: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> dict[str, Any]:
        """One page of jobs, newest first: ``{"jobs": [...], "next": cursor or None}``."""
        params = {"limit": str(limit)}
        for key, value in (("type", type), ("state", state), ("after", after)):
            if value is not None:
                params[key] = value
        page: dict[str, Any] = await self.request("GET", "/jobs", params=params)
        return page

    async def jobs(
        self, *, type: str | None = None, state: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every job, page after page."""
        after = None
        while True:
            page = await self.list(type=type, state=state, limit=1000, after=after)
            for job in page["jobs"]:
                yield job
            after = page["next"]
            if after is None:
                return

    async def cancel(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self.request("POST", f"/job/{job_id}/cancel", retry=False)
        return job

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self.request("GET", "/stats")
        return stats

    async def rerun(self, job_id: str) -> dict[str, Any]:
        """A done job waits again, with fresh attempts; its runs are kept."""
        job: dict[str, Any] = await self.request("POST", f"/job/{job_id}/rerun", retry=False)
        return job

    async def rerun_failed(
        self, type: str | None = None, *, code: str | None = None, before: Any = None
    ) -> int:
        """Rerun the tenant's failed and errored jobs (``code``: only failed or
        only error; ``type``; done ``before``, default now), call after call
        until none is left: how many."""
        if before is None:  # pinned: jobs that fail again meanwhile are not taken
            before = time.time_ns() // 1_000_000
        params = {
            key: str(value)
            for key, value in (("type", type), ("code", code), ("before", before))
            if value is not None
        }
        total = 0
        while True:
            reply = await self.request("POST", "/jobs/rerun", params=params)
            total += int(reply["rerun"])
            if not reply["more"]:
                return total

    async def pause(self, type: str) -> dict[str, Any]:
        """Pause a type: its jobs wait (adds are still taken) until ``resume``."""
        reply: dict[str, Any] = await self.request("POST", f"/type/{type}/pause")
        return reply

    async def resume(self, type: str) -> dict[str, Any]:
        reply: dict[str, Any] = await self.request("POST", f"/type/{type}/resume")
        return reply

    # --- handlers ---------------------------------------------------------------

    async def add_handler(
        self, type: str, lang: str, body: str = "", **fields: Any
    ) -> dict[str, Any]:
        """Add or replace the handler of ``type`` (``lang="worker"``: a pulled type)."""
        sent: dict[str, Any] = {"lang": lang, **fields}
        if body:
            sent["body"] = body
        handler: dict[str, Any] = await self.request("POST", f"/handler/add/{type}", json=sent)
        return handler

    async def get_handler(self, type: str) -> dict[str, Any]:
        handler: dict[str, Any] = await self.request("GET", f"/handler/get/{type}")
        return handler

    async def delete_handler(self, type: str) -> None:
        await self.request("POST", f"/handler/del/{type}", retry=False)

    # --- blobs ------------------------------------------------------------------

    async def put_blob(self, data: bytes) -> str:
        """Keep ``data`` as a blob (at most 16 MiB); its address, ``sha256:<hex>``."""
        reply = await self.request("PUT", "/blob", data=data)
        addr: str = reply["addr"]
        return addr

    async def get_blob(self, addr: str) -> bytes:
        data: bytes = await self.request("GET", f"/blob/{addr}", raw=True)
        return data

    async def delete_blob(self, addr: str) -> None:
        await self.request("DELETE", f"/blob/{addr}", retry=False)

    async def add_input(self, type: str, addr: str) -> str:
        """Add one job whose payload is the blob ``addr`` (one line of text); its id."""
        reply = await self.request(
            "POST", f"/job/{type}/add", data=b"", params={"input": addr}, retry=False
        )
        job_id: str = reply["ids"][0]
        return job_id

    # --- pull workers (the Worker uses these) -----------------------------------

    async def claim(
        self, type: str, worker: str, *, limit: int = 1, wait: float = 0
    ) -> builtins.list[dict[str, Any]]:
        body = {"worker": worker, "limit": limit, "wait": min(wait, MAX_WAIT_S)}
        reply = await self.request("POST", f"/job/{type}/claim", json=body)
        jobs: builtins.list[dict[str, Any]] = reply["jobs"]
        return jobs

    async def renew_many(
        self, worker: str, claims: builtins.list[dict[str, str]]
    ) -> builtins.list[dict[str, Any]]:
        reply = await self.request("POST", "/jobs/renew", json={"worker": worker, "claims": claims})
        results: builtins.list[dict[str, Any]] = reply["results"]
        return results

    async def complete_many(
        self, worker: str, results: builtins.list[dict[str, Any]]
    ) -> builtins.list[dict[str, Any]]:
        reply = await self.request(
            "POST", "/jobs/complete", json={"worker": worker, "results": results}
        )
        answers: builtins.list[dict[str, Any]] = reply["results"]
        return answers

    async def release_many(
        self, worker: str, claims: builtins.list[dict[str, str]]
    ) -> builtins.list[dict[str, Any]]:
        reply = await self.request(
            "POST", "/jobs/release", json={"worker": worker, "claims": claims}
        )
        answers: builtins.list[dict[str, Any]] = reply["results"]
        return answers


__all__ = ["Client", "QueueError", "backoff", "nothing_done"]

"""A tenant's view of the daemon over HTTP (docs/api.md), and polling with deadlines."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")
LARGE_BODY = 512 * 1024

JOB_FIELDS = {
    "id",
    "type",
    "state",
    "dt",
    "create_dt",
    "done_dt",
    "attempts",
    "code",
    "exitcode",
    "result",
}
STAT_FIELDS = {
    "waiting",
    "scheduled",
    "blocked",
    "running",
    "done_ok",
    "done_failed",
    "done_error",
    "paused",
}


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.status} {self.content_type} {self.body[:500]!r}"


def assert_error(reply: Reply, status: int, kind: str | None = None) -> dict[str, Any]:
    """The reply is docs/api.md's error shape with ``status`` (and ``kind``, if given)."""
    assert reply.status == status, f"expected {status}, got {reply}"
    assert reply.content_type == "application/json", f"not JSON: {reply}"
    body = reply.json
    assert isinstance(body, dict), reply
    assert isinstance(body.get("error"), str) and body["error"], reply
    assert isinstance(body.get("message"), str) and body["message"], reply
    if kind is not None:
        assert body["error"] == kind, f"expected error {kind!r}, got {reply}"
    return body


class Api:
    """Requests of one tenant (``client``, ``token``) to one daemon (``url``)."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, client: str, token: str | None
    ) -> None:
        self.session = session
        self.url = url
        self.client = client
        self.token = token

    def as_(self, client: str, token: str | None) -> Api:
        return Api(self.session, self.url, client, token)

    def at(self, url: str) -> Api:
        return Api(self.session, url, self.client, self.token)

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | str | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
    ) -> Reply:
        sent = dict(headers or {})
        if auth and self.token is not None:
            sent.setdefault("Authorization", f"Bearer {self.token}")
        raw = data.encode() if isinstance(data, str) else data
        # aiohttp wants large bodies as file objects
        body = io.BytesIO(raw) if raw is not None and len(raw) > LARGE_BODY else raw
        async with self.session.request(
            method, self.url + path, data=body, params=params, headers=sent
        ) as response:
            body = await response.read()
            return Reply(response.status, response.content_type, body, dict(response.headers))

    # --- routes -------------------------------------------------------------

    async def add_raw(
        self,
        jobtype: str,
        body: bytes | str,
        *,
        content_type: str = "text/plain",
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        return await self.request(
            "POST",
            f"/{self.client}/job/{jobtype}/add",
            data=body,
            params=params,
            headers={"Content-Type": content_type, **(headers or {})},
        )

    async def add(
        self, jobtype: str, lines: list[str], params: Mapping[str, str] | None = None
    ) -> list[str]:
        """Add one job per line; assert 200 and one id per line."""
        reply = await self.add_raw(jobtype, "\n".join(lines) + "\n", params=params)
        assert reply.status == 200, reply
        assert reply.content_type == "application/json", reply
        ids = reply.json["ids"]
        assert isinstance(ids, list) and len(ids) == len(lines), reply
        assert all(isinstance(i, str) and i for i in ids), reply
        return ids

    async def get_job(self, job_id: str) -> Reply:
        return await self.request("GET", f"/{self.client}/job/{job_id}")

    async def cancel(self, job_id: str) -> Reply:
        return await self.request("POST", f"/{self.client}/job/{job_id}/cancel")

    async def jobs(self, **params: str) -> Reply:
        return await self.request("GET", f"/{self.client}/jobs", params=params)

    async def stats(self) -> Reply:
        return await self.request("GET", f"/{self.client}/stats")

    async def healthz(self) -> Reply:
        return await self.request("GET", "/healthz", auth=False)

    async def livez(self) -> Reply:
        return await self.request("GET", "/livez", auth=False)

    async def readyz(self) -> Reply:
        return await self.request("GET", "/readyz", auth=False)

    async def metrics(self) -> Reply:
        """``GET /metrics`` with this Api's token (an operator's, to get a 200)."""
        return await self.request("GET", "/metrics")

    # --- waiting --------------------------------------------------------------

    async def wait_job(self, job_id: str, within: float = 20.0) -> dict[str, Any]:
        """Poll ``GET /{client}/job/{id}`` until 200; return the job."""

        async def probe() -> dict[str, Any] | None:
            reply = await self.get_job(job_id)
            if reply.status == 404:
                return None
            assert reply.status == 200, reply
            job: dict[str, Any] = reply.json
            return job

        return await until(probe, within, f"job {job_id} in the store")

    async def wait_caught_up(self, within: float = 20.0) -> dict[str, Any]:
        """Poll ``/healthz`` until it is 200 with no ingest lag; return its body."""

        async def probe() -> dict[str, Any] | None:
            reply = await self.healthz()
            if reply.status == 503:
                return None
            assert reply.status == 200, reply
            body: dict[str, Any] = reply.json
            return body if body["ingest_lag"]["lines"] == 0 else None

        return await until(probe, within, "healthz 200 with ingest_lag 0")

    async def type_stats(self, jobtype: str) -> dict[str, int] | None:
        reply = await self.stats()
        assert reply.status == 200, reply
        types: dict[str, dict[str, int]] = reply.json["types"]
        return types.get(jobtype)

    async def all_jobs(self, **params: str) -> list[dict[str, Any]]:
        """Every page of ``GET /{client}/jobs``, following ``next``."""
        out: list[dict[str, Any]] = []
        query = dict(params)
        for _ in range(10_000):
            reply = await self.jobs(**query)
            assert reply.status == 200, reply
            page = reply.json
            out.extend(page["jobs"])
            if page["next"] is None:
                return out
            query["after"] = page["next"]
        raise AssertionError("paging never ended")


async def until(
    probe: Callable[[], Awaitable[T | None]], within: float, what: str, interval: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None, or fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        result = await probe()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


# --- handlers and running jobs (docs/api.md "Handlers") ------------------------------


async def _handler_reply(api: Api, method: str, action: str, jobtype: str, **kw: Any) -> Reply:
    return await api.request(method, f"/{api.client}/handler/{action}/{jobtype}", **kw)


class Handlers:
    """The handler routes of one tenant: ``Handlers(api).add(...)``."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def add_raw(self, jobtype: str, fields: Mapping[str, Any]) -> Reply:
        """``POST handler/add/{type}`` with a JSON body."""
        return await _handler_reply(
            self.api,
            "POST",
            "add",
            jobtype,
            data=json.dumps(dict(fields)),
            headers={"Content-Type": "application/json"},
        )

    async def add_text(self, jobtype: str, source: str, lang: str) -> Reply:
        """``POST handler/add/{type}?lang=`` with the source as ``text/plain``."""
        return await _handler_reply(
            self.api,
            "POST",
            "add",
            jobtype,
            data=source,
            params={"lang": lang},
            headers={"Content-Type": "text/plain"},
        )

    async def add(self, jobtype: str, lang: str, body: str, **fields: Any) -> dict[str, Any]:
        """Add (or replace) a handler; assert 200; return the stored handler."""
        reply = await self.add_raw(jobtype, {"lang": lang, "body": body, **fields})
        assert reply.status == 200, reply
        stored: dict[str, Any] = reply.json
        assert isinstance(stored.get("id"), str) and stored["id"], reply
        return stored

    async def get(self, jobtype: str) -> Reply:
        return await _handler_reply(self.api, "GET", "get", jobtype)

    async def delete(self, jobtype: str) -> Reply:
        return await _handler_reply(self.api, "POST", "del", jobtype)


async def add_json(api: Api, jobtype: str, payloads: list[Any]) -> list[str]:
    """Add one job per element of a JSON array; assert 200 and one id each."""
    reply = await api.add_raw(jobtype, json.dumps(payloads), content_type="application/json")
    assert reply.status == 200, reply
    ids = reply.json["ids"]
    assert isinstance(ids, list) and len(ids) == len(payloads), reply
    return ids


async def wait_done(api: Api, job_id: str, within: float = 20.0) -> dict[str, Any]:
    """Poll ``GET /{client}/job/{id}`` until the job is ``done``; return it."""
    last: dict[str, Any] | None = None

    async def probe() -> dict[str, Any] | None:
        nonlocal last
        reply = await api.get_job(job_id)
        if reply.status == 404:
            return None
        assert reply.status == 200, reply
        last = reply.json
        assert last is not None
        return last if last["state"] == "done" else None

    try:
        return await until(probe, within, f"job {job_id} to be done", interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {last}") from None


async def wait_all_done(
    api: Api, ids: list[str], within: float = 30.0, jobtype: str | None = None
) -> dict[str, dict[str, Any]]:
    """Poll until every job of ``ids`` is ``done``; return id -> job.

    With ``jobtype`` it reads the type's list of done jobs (cheap for many ids);
    otherwise it asks for each job still not done.
    """
    wanted = set(ids)
    done: dict[str, dict[str, Any]] = {}

    async def one(job_id: str) -> None:
        reply = await api.get_job(job_id)
        if reply.status == 200 and reply.json["state"] == "done":
            done[job_id] = reply.json
        else:
            assert reply.status in (200, 404), reply

    async def probe() -> dict[str, dict[str, Any]] | None:
        if jobtype is not None:
            for job in await api.all_jobs(type=jobtype, state="done", limit="1000"):
                if job["id"] in wanted:
                    done[job["id"]] = job
        else:
            await asyncio.gather(*(one(i) for i in wanted - done.keys()))
        return done if len(done) == len(wanted) else None

    try:
        return await until(probe, within, f"{len(wanted)} jobs to be done", interval=0.2)
    except AssertionError as exc:
        missing = sorted(wanted - done.keys())
        states = [(await api.get_job(i)).json for i in missing[:3]]
        raise AssertionError(
            f"{exc}: {len(missing)} of {len(wanted)} not done, e.g. {states}"
        ) from None


# --- pull workers (docs/workers.md) -------------------------------------------------


async def post_json(api: Api, path: str, body: Any) -> Reply:
    """``POST /{client}{path}`` with a JSON body."""
    return await api.request(
        "POST",
        f"/{api.client}{path}",
        data=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )


async def pulled_type(api: Api, jobtype: str, **fields: Any) -> dict[str, Any]:
    """Make ``jobtype`` pulled (a handler of lang worker); assert 200."""
    reply = await Handlers(api).add_raw(jobtype, {"lang": "worker", **fields})
    assert reply.status == 200, reply
    stored: dict[str, Any] = reply.json
    return stored


async def claim_jobs(api: Api, jobtype: str, worker: str, **fields: Any) -> list[dict[str, Any]]:
    """Claim jobs of ``jobtype`` as ``worker``; assert 200."""
    reply = await post_json(api, f"/job/{jobtype}/claim", {"worker": worker, **fields})
    assert reply.status == 200, reply
    jobs: list[dict[str, Any]] = reply.json["jobs"]
    return jobs


async def claimed(
    api: Api, jobtype: str, worker: str, within: float = 30.0, **fields: Any
) -> list[dict[str, Any]]:
    """Claim until a claim returns jobs (within ``within`` seconds)."""

    async def probe() -> list[dict[str, Any]] | None:
        return await claim_jobs(api, jobtype, worker, **fields) or None

    return await until(probe, within, f"jobs of {jobtype} to claim")

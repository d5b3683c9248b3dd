"""A small asynchronous client of the tenant API (docs/api.md), for the end-to-end sections."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from bench.procs import BenchError

UNAVAILABLE_RETRIES = 10
STATE_KEYS = ("waiting", "scheduled", "running", "done_ok", "done_failed", "done_error")


class Api:
    """One daemon's URL, one tenant's token."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str, client: str) -> None:
        self.session = session
        self.url = url
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}
        self.stats_seconds: list[float] = []  # how long each /stats took (its cost is load)

    async def _json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """The reply's status and JSON body; a ``503`` (the daemon cannot reach its
        store for a moment) is asked again after its ``Retry-After``, a few times,
        as a client should."""
        for _ in range(UNAVAILABLE_RETRIES):
            status, data = await self._once(method, path, **kwargs)
            if status != 503:
                break
            await asyncio.sleep(1.0)
        return status, data

    async def _once(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        headers = {**self.headers, **kwargs.get("headers", {})}
        kwargs = {k: v for k, v in kwargs.items() if k != "headers"}
        try:
            async with self.session.request(
                method, f"{self.url}/{self.client}{path}", headers=headers, **kwargs
            ) as reply:
                body = await reply.read()
                try:
                    data = await reply.json(content_type=None) if body else None
                except ValueError:
                    data = body.decode(errors="replace")
                return reply.status, data
        except (aiohttp.ClientError, OSError) as exc:
            raise BenchError(f"{method} {self.url}/{self.client}{path}: {exc!r}") from None

    async def add_handler(self, type_: str, lang: str, body: str) -> None:
        status, data = await self._json(
            "POST", f"/handler/add/{type_}", json={"lang": lang, "body": body}
        )
        if status != 200:
            raise BenchError(f"handler add {type_} ({lang}) answered {status}: {data}")

    async def del_handler(self, type_: str) -> None:
        status, data = await self._json("POST", f"/handler/del/{type_}")
        if status != 200:
            raise BenchError(f"handler del {type_} answered {status}: {data}")

    async def pause(self, type_: str, paused: bool = True) -> None:
        """Pause (or resume) a type: its jobs wait, its contexts stay warm."""
        action = "pause" if paused else "resume"
        status, data = await self._json("POST", f"/type/{type_}/{action}")
        if status != 200:
            raise BenchError(f"{action} {type_} answered {status}: {data}")

    async def post(self, type_: str, body: bytes) -> list[str]:
        """The ids of the lines of ``body``, acknowledged (journaled) by the daemon."""
        status, data = await self._json(
            "POST", f"/job/{type_}/add", data=body, headers={"Content-Type": "text/plain"}
        )
        if status != 200 or not isinstance(data, dict) or "ids" not in data:
            raise BenchError(f"add to {type_} answered {status}: {str(data)[:500]}")
        ids: list[str] = data["ids"]
        return ids

    async def stats(self, type_: str) -> dict[str, int]:
        """The type's counts (every key of STATE_KEYS; zeros before its first job)."""
        t0 = time.perf_counter()
        status, data = await self._json("GET", "/stats")
        self.stats_seconds.append(time.perf_counter() - t0)
        if status != 200 or not isinstance(data, dict):
            raise BenchError(f"/stats answered {status}: {str(data)[:500]}")
        counts = data.get("types", {}).get(type_, {})
        return {key: int(counts.get(key, 0)) for key in STATE_KEYS}

    async def job(self, job_id: str, wait: float = 0) -> dict[str, Any] | None:
        """The job, or None while it is not in the store yet; ``wait``: held up to
        that many seconds until it is done (``?wait=``)."""
        query = f"?wait={wait:g}" if wait else ""
        status, data = await self._json("GET", f"/job/{job_id}{query}")
        if status == 404:
            return None
        if status != 200 or not isinstance(data, dict):
            raise BenchError(f"GET job {job_id} answered {status}: {str(data)[:500]}")
        return data

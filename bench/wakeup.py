"""How soon a pull worker's held claim on one daemon sees a job added on another
daemon sharing the store: add acknowledged → claim answered, one job at a time."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

JOBTYPE = "bench_pulled_wake"


async def _post(session: aiohttp.ClientSession, url: str, body: object) -> object:
    async with session.post(url, data=orjson.dumps(body)) as reply:
        if reply.status != 200:
            raise RuntimeError(f"{url}: {reply.status} {await reply.text()}")
        return orjson.loads(await reply.read())


async def measure_wakeup(
    claim_url: str, add_url: str, token: str, client: str, *, samples: int, warm: int = 5
) -> list[float]:
    """Milliseconds from each add's reply (on ``add_url``) to the reply of a claim
    held on ``claim_url`` that returns the job."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    woke: list[float] = []
    async with aiohttp.ClientSession(headers=headers) as session:
        await _post(session, f"{add_url}/{client}/handler/add/{JOBTYPE}", {"lang": "worker"})
        claim = f"{claim_url}/{client}/job/{JOBTYPE}/claim"
        for n in range(samples + warm):
            held = asyncio.ensure_future(
                _post(session, claim, {"worker": "bench", "limit": 1, "wait": 30})
            )
            await asyncio.sleep(0.05)  # the claim reaches the daemon and waits
            async with session.post(
                f"{add_url}/{client}/job/{JOBTYPE}/add",
                data=b"x",
                headers={"Content-Type": "text/plain"},
            ) as reply:
                if reply.status != 200:
                    raise RuntimeError(f"add: {reply.status} {await reply.text()}")
                added = time.perf_counter()
            got = await held
            took = (time.perf_counter() - added) * 1000
            jobs = got["jobs"] if isinstance(got, dict) else []
            if not jobs:
                raise RuntimeError("the held claim returned no job")
            job = jobs[0]
            await _post(
                session,
                f"{claim_url}/{client}/job/{job['id']}/complete",
                {"worker": "bench", "claim": job["claim"]},
            )
            if n >= warm:
                woke.append(took)
    return woke

"""Per-tenant add rate: a flood is refused with 429 and Retry-After, others unaffected."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from harness.daemons import DaemonFactory, deploy


async def test_add_rate_is_limited_per_tenant(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    deployed = deploy(
        daemons, pg_dsn, tmp_path, ["flood", "calm"], "--tenant-rate", "1", "--tenant-burst", "10"
    )
    flood, calm = deployed.api(session, "flood"), deployed.api(session, "calm")
    headers = {"Authorization": f"Bearer {deployed.tokens['flood']}"}
    async with session.post(
        f"{deployed.url}/flood/job/t/add", data=b"x\n" * 11, headers=headers
    ) as r:
        assert r.status == 413  # more than the burst can ever hold
        assert (await r.json())["error"] == "too_large"
    await flood.add("t", [f"{n}" for n in range(10)])  # the whole burst
    async with session.post(f"{deployed.url}/flood/job/t/add", data=b"x\ny", headers=headers) as r:
        assert r.status == 429
        assert r.content_type == "application/json"
        assert (await r.json())["error"] == "rate_limited"
        assert int(r.headers["Retry-After"]) >= 1
    await calm.add("t", ["still welcome"])  # another tenant's bucket is its own
    calm_headers = {"Authorization": f"Bearer {deployed.tokens['calm']}"}
    big = b"x" * (640 << 10)  # one job, and ten for its ten 64 KiB: over the burst of 10
    async with session.post(f"{deployed.url}/calm/job/t/add", data=big, headers=calm_headers) as r:
        assert r.status == 413, await r.text()
        assert "over this tenant's burst of 10" in (await r.json())["message"]

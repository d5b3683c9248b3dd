"""A tenant flooding the daemon does not keep another tenant's jobs from starting.

Tenant ``flood`` queues tens of thousands of slow jobs (each holds its slot and its
runner context for three seconds), more than the daemon may run at once, and keeps
adding more; tenant ``calm`` then adds a handful of jobs one at a time, and
each must start within a generous bound while the flood is still on (many
jobs running and waiting, checked before and after). The calm tenant's jobs
also keep their warm context: the flood may not take every context, so the
daemon never closes the calm tenant's to make room. As root, the flood's
handlers are marked busy on the CPU (idle-class among the tenants' groups) and
the calm tenant's are not. The exact figure, and its ratio to an idle daemon's,
is measured by ``python -m bench --only flood``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from harness.api import Api, Handlers, until, wait_done
from harness.daemons import DaemonFactory, deploy
from queue_daemon.runners.sandbox.users import TENANT_UID_BASE

SLOW = "slow"
QUICK = "quick"
HOLD = "hold"  # a calm job that runs while the CPU marks are read
BACKLOG = 20_000  # flood jobs queued before the calm tenant's first job
POST_LINES = 1_000
TOP_UP = 200  # flood jobs added per POST while the calm tenant's jobs run
CALM_JOBS = 5
START_BOUND_S = 5.0  # generous: on an idle daemon a job starts within ~10 ms
FLOOD_RUNNING = 48  # flood jobs (one per context) at once: most of the daemon's 64 contexts
STILL_ON = 8  # flood jobs still running at the end (the claims may lag on a busy machine)

SLOW_HANDLER = "import time\n\n\ndef handler(payload, ctx):\n    time.sleep(3.0)\n"
# the start time, and a mark of the context it ran in
CLOCK_HANDLER = (
    "import os, time\n\nMARK = os.urandom(8).hex()\n\n\ndef handler(payload, ctx):\n"
    "    return f'{time.time()!r} {MARK}'\n"
)


def _cpu_marks(uids: dict[str, int]) -> dict[str, str] | None:
    """The ``cpu.idle`` of the calm tenant's CPU group and of the flood's beside
    it (found from the host: handlers see their cgroups from their own cgroup
    namespace); None without them."""
    from queue_daemon.runners.sandbox.cpuplace import v1_cpu_mount

    mount = v1_cpu_mount()
    if mount is None or os.geteuid() != 0:
        return None
    found = sorted(mount.rglob(f"u-{uids['calm']}"))
    if not found:
        return None
    calm = found[0]
    flood = calm.parent / f"u-{uids['flood']}"
    if not (calm / "cpu.idle").exists():
        return None
    return {
        "calm": (calm / "cpu.idle").read_text().strip(),
        "flood": (flood / "cpu.idle").read_text().strip(),
    }


async def _marks_beside_a_calm_run(calm: Api, dsn: str) -> dict[str, str] | None:
    """The CPU marks once a calm job runs beside the flood (a tenant is busy only
    beside another that runs something: ``scheduler.cpu.busy_tenants``); None
    without them. The marks follow the running batches: polled, not read once."""
    uids = await tenant_uids(dsn)
    if await asyncio.to_thread(_cpu_marks, uids) is None:
        return None
    await calm.add(HOLD, ["hold"])
    expected = {"calm": "0", "flood": "1"}
    seen: list[dict[str, str] | None] = []

    async def marked() -> dict[str, str] | None:
        seen.append(await asyncio.to_thread(_cpu_marks, uids))
        return seen[-1] if seen[-1] == expected else None

    try:
        return await until(marked, 10, f"the marks {expected}", interval=0.1)
    except AssertionError:
        return seen[-1]  # the assertion below says what they were


async def tenant_uids(dsn: str) -> dict[str, int]:
    """Each tenant's uid, from its slot in the store (the daemon's default range)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT client, slot FROM tenant_uids")
    finally:
        await conn.close()
    return {row["client"]: TENANT_UID_BASE + row["slot"] for row in rows}


async def _flood_counts(api: Api) -> dict[str, int]:
    counts = await api.type_stats(SLOW)
    assert counts is not None, "the flood's jobs are not in the store"
    return counts


async def _keep_flooding(api: Api, added: list[int]) -> None:
    """Add ``TOP_UP`` more flood jobs after each acknowledgement, until cancelled."""
    lines = [f"{n}" for n in range(TOP_UP)]
    while True:
        await api.add(SLOW, lines)
        added[0] += TOP_UP
        await asyncio.sleep(0.05)  # pacing of the load, not synchronisation


@pytest.mark.timeout(180)
async def test_a_flood_does_not_hold_up_another_tenants_jobs(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    deployed = deploy(daemons, pg_dsn, open_tmp, ["flood", "calm"])
    flood, calm = deployed.api(session, "flood"), deployed.api(session, "calm")
    await Handlers(flood).add(SLOW, "python", SLOW_HANDLER, timeout=30)
    await Handlers(calm).add(QUICK, "python", CLOCK_HANDLER, timeout=30)
    await Handlers(calm).add(HOLD, "python", SLOW_HANDLER, timeout=30)

    for first in range(0, BACKLOG, POST_LINES):
        await flood.add(SLOW, [f"{n}" for n in range(first, first + POST_LINES)])

    async def flood_is_on() -> dict[str, int] | None:
        counts = await _flood_counts(flood)
        return counts if counts["running"] >= FLOOD_RUNNING else None

    await until(flood_is_on, 120, f"{FLOOD_RUNNING} flood jobs running at once", interval=0.5)

    added = [0]
    adder = asyncio.create_task(_keep_flooding(flood, added))
    try:
        waits: list[float] = []
        contexts: set[str] = set()
        for n in range(CALM_JOBS):
            sent = time.time()
            (job_id,) = await calm.add(QUICK, [f"calm {n}"])
            job = await wait_done(calm, job_id, within=30)
            assert (job["code"], job["exitcode"]) == ("ok", 200), job
            started, mark = job["result"].split()
            waits.append(float(started) - sent)
            contexts.add(mark)
        assert not adder.done(), "the flood's adds stopped early"
        marks = await _marks_beside_a_calm_run(calm, pg_dsn)
        during = await _flood_counts(flood)
    finally:
        adder.cancel()
        await asyncio.gather(adder, return_exceptions=True)

    assert max(waits) < START_BOUND_S, (
        f"calm jobs started after {', '.join(f'{w:.2f}' for w in waits)} s under the flood"
    )
    assert len(contexts) == 1, f"calm jobs ran in contexts {contexts}: one was closed for the flood"
    if marks is not None:  # as root, with the cgroup v1 cpu controller and cpu.idle
        assert marks == {"calm": "0", "flood": "1"}, marks
    # the flood was on all along: it still held the daemon and had plenty left
    assert added[0] > 0
    assert during["running"] >= STILL_ON, during
    assert during["waiting"] >= BACKLOG // 2, during

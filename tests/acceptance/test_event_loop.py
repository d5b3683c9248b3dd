"""The daemon on asyncio's own loop (``--event-loop asyncio``; uvloop, the default,
runs every other acceptance test): adds, python and node handlers (their contexts
started as the tenant's user) and a clean stop."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from harness.api import Api, Handlers, wait_all_done
from harness.daemons import DaemonFactory, add_tenant

HANDLERS = {
    "py": ("python", "def handler(payload, ctx):\n    return 'py ' + payload\n"),
    "js": ("node", "module.exports = async (payload, ctx) => 'js ' + payload;\n"),
}


async def test_jobs_run_on_asyncios_loop(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=open_tmp, cwd=open_tmp)
    daemon = daemons.start(open_tmp, pg_dsn, "--event-loop", "asyncio")
    api = Api(session, daemon.url, "t", token)
    handlers = Handlers(api)
    ids = {}
    for jobtype, (lang, body) in HANDLERS.items():
        await handlers.add(jobtype, lang, body)
        ids[jobtype] = await api.add(jobtype, [str(n) for n in range(20)])
    for jobtype, added in ids.items():
        done = await wait_all_done(api, added, within=60)
        assert [done[i]["result"] for i in added] == [f"{jobtype} {n}" for n in range(20)], done
    daemon.close()
    assert daemon.proc.returncode == 0

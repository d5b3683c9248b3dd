"""A daemon stalled (SIGSTOP) after it claimed a batch but before the batch reached
a handler context, past its lease: once continued, it does not start the jobs it
lost. Another daemon took them over and may be running them at that moment
(one owner at a time, docs/guarantees.md "At-least-once execution")."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import aiohttp

from harness.api import Api, Handlers, until, wait_done
from harness.daemons import DaemonFactory, DaemonProcess, add_tenant

CLIENT = "stall"
JOBTYPE = "slow"


def _handler(log: Path, slow_load: Path) -> str:
    """Loads slowly while ``slow_load`` exists (saying so in ``log``); each run
    records its start and end and sleeps as many seconds as its payload says."""
    return (
        "import os, time\n"
        f"LOG = {str(log)!r}\n"
        f"if os.path.exists({str(slow_load)!r}):\n"
        "    with open(LOG, 'a') as f:\n"
        "        f.write(f'loading {os.getcwd()}\\n')\n"
        "    time.sleep(4)\n"
        "\n"
        "def handler(payload, ctx):\n"
        "    with open(LOG, 'a') as f:\n"
        "        f.write(f'start {ctx.id} {os.getcwd()} {time.time()}\\n')\n"
        "    time.sleep(float(payload))\n"
        "    with open(LOG, 'a') as f:\n"
        "        f.write(f'end {ctx.id} {os.getcwd()} {time.time()}\\n')\n"
        "    return 'ok'\n"
    )


def ran_by(daemon: DaemonProcess, home: str) -> bool:
    """Whether a handler in directory ``home`` was ``daemon``'s (below its data dir)."""
    return home.startswith(f"{daemon.data_dir}/")


def _lines(log: Path, word: str) -> list[list[str]]:
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line.startswith(word + " ")]


async def test_a_daemon_stalled_before_a_batch_started_does_not_run_what_it_lost(
    pg_dsn: str, daemons: DaemonFactory, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    args = ("--lease", "2", "--max-batch", "1")
    token = add_tenant(CLIENT, store=pg_dsn, data_dir=open_tmp / "cli", cwd=open_tmp)
    stalled = daemons.start(open_tmp / "data0", pg_dsn, *args, name="stalled")
    shared = daemons.shared_dir()
    log, slow_load = shared / "runs.txt", shared / "slow-load"
    slow_load.touch()
    api = Api(session, stalled.url, CLIENT, token)
    await Handlers(api).add(JOBTYPE, "python", _handler(log, slow_load), timeout=30)
    [job_id] = await api.add(JOBTYPE, ["3"])

    async def loading() -> bool | None:
        loads = [p[1] for p in _lines(log, "loading")]
        return True if any(ran_by(stalled, home) for home in loads) else None

    # the daemon claimed the job and waits for its new context to load the handler
    await until(loading, 20, "the first daemon to load the handler", interval=0.02)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        slow_load.unlink()
        survivor = daemons.start(open_tmp / "data1", pg_dsn, *args, name="survivor")

        async def taken_over() -> bool | None:
            starts = [p for p in _lines(log, "start") if p[1] == job_id]
            return True if any(ran_by(survivor, p[2]) for p in starts) else None

        await until(taken_over, 30, "the second daemon to run the job", interval=0.02)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    job = await wait_done(api.at(survivor.url), job_id, within=30)
    assert (job["code"], job["exitcode"]) == ("ok", 200), job

    def lost_lease() -> list[dict[str, object]]:
        found = []
        for path in stalled.data_dir.glob("queue-*.log"):
            for text in path.read_text().splitlines():
                record = json.loads(text)
                if record["ev"] == "lost-lease" and record.get("id") == job_id:
                    found.append(record)
        return found

    async def gave_up() -> list[dict[str, object]] | None:
        return lost_lease() or None

    # whether it ran the job or not, the stalled daemon's release is refused
    await until(gave_up, 30, "the stalled daemon to learn it lost the job")
    runs = [p for p in _lines(log, "start") if p[1] == job_id]
    assert [ran_by(survivor, p[2]) for p in runs] == [True], (
        f"the stalled daemon ({stalled.data_dir}) started a job it had lost to "
        f"{survivor.data_dir}: {log.read_text()}"
    )

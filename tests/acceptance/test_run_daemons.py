"""Several real daemons running one store's jobs (docs/architecture.md invariants 3 and 4).

Every job ends done exactly once in the store; a handler's own record (a file
each run appends to) shows no job running twice at overlapping times; a daemon
killed with SIGKILL leaves jobs that the others rerun once its leases expire;
a daemon stopped with SIGTERM hands its unfinished jobs back at once.

The handler processes run as an unprivileged user with a scrubbed environment,
so the file they write is in a world-writable directory whose path is written
literally into the handler's source.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from harness.api import Api, Handlers, until, wait_all_done, wait_done
from harness.daemons import DaemonFactory, DaemonProcess, add_tenant, living_in
from tests.acceptance.scrape import scrape, value
from tests.acceptance.storecheck import duplicates, fetch_counts

CLIENT = "many"
JOBTYPE = "work"


def recording_handler(log: Path, sleep: float | None) -> str:
    """Python source of a handler that records each run (start line, then run line)
    and sleeps ``sleep`` seconds in between (None: as many as its payload says, or
    while the file named by a payload ``hold:PATH`` exists, at most 60 s)."""
    return (
        "import os, time\n"
        "\n"
        "def handler(payload, ctx):\n"
        "    start = time.time()\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(f'start {ctx.id} {start} {os.getcwd()}\\n')\n"
        "    if payload.startswith('hold:'):\n"
        "        while os.path.exists(payload[5:]) and time.time() < start + 60:\n"
        "            time.sleep(0.02)\n"
        "    else:\n"
        f"        time.sleep({'float(payload)' if sleep is None else sleep})\n"
        "    end = time.time()\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(f'run {ctx.id} {start} {end} {os.getcwd()}\\n')\n"
        "    return 'ok ' + payload\n"
    )


@dataclass(frozen=True, slots=True)
class Run:
    job_id: str
    start: float
    end: float | None  # None: started, never finished (its process was killed)
    # the context's directory: below the data directory of the daemon that ran it
    # (its pid is the same small number in every context, a PID namespace of its own)
    home: str

    def by(self, daemon: DaemonProcess) -> bool:
        """Whether ``daemon`` ran it."""
        return self.home.startswith(f"{daemon.data_dir}/")


def read_runs(log: Path) -> list[Run]:
    """Every run in the file; a run whose end line is missing has ``end`` None."""
    if not log.exists():
        return []
    started: dict[tuple[str, str, str], Run] = {}
    runs: list[Run] = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "start":
            _, job_id, start, home = parts
            started[(job_id, home, start)] = Run(job_id, float(start), None, home)
        elif len(parts) == 5 and parts[0] == "run":
            _, job_id, start, end, home = parts
            started.pop((job_id, home, start), None)
            runs.append(Run(job_id, float(start), float(end), home))
        else:
            # a line torn by a killed process would show up here
            raise AssertionError(f"unexpected line in the handlers' record: {line!r}")
    return runs + list(started.values())


def assert_no_overlapping_runs(runs: list[Run]) -> None:
    """No job ran twice at the same time (one owner at a time).

    A run without an end (its process was killed) cannot be placed in time here;
    the tests that kill runs check that their processes are gone.
    """
    by_id: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_id[run.job_id].append(run)
    for job_id, its_runs in by_id.items():
        its_runs.sort(key=lambda r: r.start)
        for before, after in itertools.pairwise(its_runs):
            assert before.end is None or before.end <= after.start, (
                f"job {job_id} ran twice at overlapping times: {before} and {after}"
            )


async def start_fleet(
    daemons: DaemonFactory, dsn: str, root: Path, count: int, *args: str
) -> tuple[list[DaemonProcess], str]:
    """A tenant, then ``count`` daemons on ``dsn``, each with its own data directory."""
    token = add_tenant(CLIENT, store=dsn, data_dir=root / "cli", cwd=root)
    fleet = [daemons.spawn(root / f"data{i}", dsn, *args, name=f"daemon{i}") for i in range(count)]
    for daemon in fleet:
        daemon.wait_ready()
    return fleet, token


async def assert_done_once_in_store(dsn: str, ids: list[str]) -> None:
    assert await duplicates(dsn) == []
    counts = await fetch_counts(dsn)
    assert all(counts.get(i) == 1 for i in ids), "a job is missing from the store"
    conn = await asyncpg.connect(dsn)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1::text[]) AND lock <> '__done'", ids
        )
    finally:
        await conn.close()
    assert left == 0, f"{left} jobs not archived"


@pytest.mark.parametrize("count", [2, 3])
async def test_daemons_share_the_jobs_and_run_each_once(
    count: int,
    pg_dsn: str,
    daemons: DaemonFactory,
    open_tmp: Path,
    session: aiohttp.ClientSession,
) -> None:
    # small batches and caps, so that no daemon takes every job before the others wake
    fleet, token = await start_fleet(
        daemons, pg_dsn, open_tmp, count, "--lease", "3", "--max-batch", "10", "--concurrency", "20"
    )
    log = daemons.shared_dir() / "runs.txt"
    api = Api(session, fleet[0].url, CLIENT, token)
    await Handlers(api).add(JOBTYPE, "python", recording_handler(log, 0.01), timeout=10)
    ids = await api.add(JOBTYPE, [str(n) for n in range(300)])

    jobs = await wait_all_done(api, ids, within=60, jobtype=JOBTYPE)
    bad = [j for j in jobs.values() if (j["code"], j["exitcode"], j["attempts"]) != ("ok", 200, 1)]
    assert not bad, f"{len(bad)} jobs did not end ok on the first attempt, e.g. {bad[:3]}"
    assert all(jobs[i]["result"] == f"ok {n}" for n, i in enumerate(ids))
    await assert_done_once_in_store(pg_dsn, ids)

    runs = read_runs(log)
    assert_no_overlapping_runs(runs)
    ran: dict[str, int] = defaultdict(int)
    for run in runs:
        ran[run.job_id] += 1
    assert set(ran) == set(ids), "a done job has no record of its run"
    assert [i for i, n in ran.items() if n > 1] == [], "a job ran more than once without a crash"
    workers = {d.name for d in fleet if any(run.by(d) for run in runs)}
    assert len(workers) >= 2, f"only daemons {workers} of {[d.name for d in fleet]} ran jobs"


async def test_jobs_of_a_killed_daemon_are_rerun_by_the_others(
    pg_dsn: str, daemons: DaemonFactory, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    fleet, token = await start_fleet(
        daemons, pg_dsn, open_tmp, 2, "--lease", "3", "--max-batch", "2", "--concurrency", "4"
    )
    victim, survivor = fleet
    log = daemons.shared_dir() / "runs.txt"
    api = Api(session, survivor.url, CLIENT, token)
    await Handlers(api).add(JOBTYPE, "python", recording_handler(log, 0.5), timeout=10)
    ids = await api.add(JOBTYPE, [str(n) for n in range(24)])

    async def victim_started() -> bool | None:
        return True if any(r.by(victim) for r in read_runs(log)) else None

    await until(victim_started, 20, "the victim daemon to start jobs", interval=0.05)
    victim.kill()
    killed_at = time.monotonic()

    jobs = await wait_all_done(api, ids, within=30, jobtype=JOBTYPE)
    assert all((j["code"], j["exitcode"]) == ("ok", 200) for j in jobs.values()), jobs
    rerun = [j for j in jobs.values() if j["attempts"] >= 2]
    assert rerun, "the killed daemon held jobs that nobody had to run again"
    assert time.monotonic() - killed_at < 25
    await assert_done_once_in_store(pg_dsn, ids)
    runs = read_runs(log)
    assert_no_overlapping_runs(runs)
    finished = {r.job_id for r in runs if r.end is not None}
    assert finished == set(ids), "a done job has no finished run"
    reply = await api.healthz()
    assert reply.status == 200, reply


async def test_sigterm_hands_unfinished_jobs_back_at_once(
    pg_dsn: str, daemons: DaemonFactory, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    # a lease long enough that only an explicit hand-back explains a quick rerun
    args = ("--lease", "30", "--drain-timeout", "1", "--max-batch", "1", "--concurrency", "4")
    [victim], token = await start_fleet(daemons, pg_dsn, open_tmp, 1, *args)
    log = daemons.shared_dir() / "runs.txt"
    api = Api(session, victim.url, CLIENT, token)
    await Handlers(api).add(JOBTYPE, "python", recording_handler(log, None), timeout=20)
    # a quick job first: the daemon learns the type, then runs long jobs side by side
    [warm] = await api.add(JOBTYPE, ["0"])
    await wait_done(api, warm)
    # the long jobs run until the test lets them go: on a slow machine they must
    # not finish in the victim before it is stopped
    hold = log.parent / "hold"
    hold.touch()
    payloads = [f"hold:{hold}"] * 2
    ids = await api.add(JOBTYPE, payloads)

    async def all_started() -> bool | None:
        started = {r.job_id for r in read_runs(log) if r.by(victim)}
        return True if started >= set(ids) else None

    await until(all_started, 10, "the first daemon to start the long jobs", interval=0.05)
    survivor = daemons.start(open_tmp / "data-survivor", pg_dsn, *args)
    api = api.at(survivor.url)

    stopped_at = time.monotonic()
    assert victim.terminate() == 0, victim.stderr_text()[-3000:]
    assert time.monotonic() - stopped_at < 10, "SIGTERM took far longer than --drain-timeout"
    hold.unlink()  # the reruns in the survivor end at once
    jobs = await wait_all_done(api, ids, within=15, jobtype=JOBTYPE)
    elapsed = time.monotonic() - stopped_at
    assert elapsed < 15, f"jobs done {elapsed:.1f} s after SIGTERM: not handed back at once"
    assert [jobs[i]["result"] for i in ids] == [f"ok {p}" for p in payloads], jobs
    for job in jobs.values():
        assert (job["code"], job["exitcode"]) == ("ok", 200), job
        # the interrupted run does not count as an attempt
        assert job["attempts"] == 1, job
    runs = read_runs(log)
    assert_no_overlapping_runs(runs)
    # the interrupted runs' processes died with the stopped daemon
    for run in runs:
        if run.end is None:
            assert not living_in(run.home), f"{run}: its process outlived its daemon"
    shown = f"victim {victim.pid}, survivor {survivor.pid}: {runs}"
    assert {r.job_id for r in runs if r.end is not None and r.by(survivor)} == set(ids), shown
    assert not [r for r in runs if r.job_id in ids and r.end and r.by(victim)], shown


async def test_slow_jobs_of_a_new_type_run_side_by_side(
    pg_dsn: str, daemons: DaemonFactory, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    """Eight 1 s jobs of a type the daemon has never run take about 1 s, not 8."""
    [daemon], token = await start_fleet(daemons, pg_dsn, open_tmp, 1, "--lease", "10")
    log = daemons.shared_dir() / "runs.txt"
    api = Api(session, daemon.url, CLIENT, token)
    await Handlers(api).add(JOBTYPE, "python", recording_handler(log, None), timeout=10)
    posted = time.monotonic()
    ids = await api.add(JOBTYPE, ["1"] * 8)
    await wait_all_done(api, ids, within=20, jobtype=JOBTYPE)
    elapsed = time.monotonic() - posted
    runs = sorted(read_runs(log), key=lambda r: r.start)
    assert elapsed < 5, (
        f"8 jobs of 1 s took {elapsed:.1f} s: run one after another "
        f"({len({r.home for r in runs})} context(s))"
    )


async def test_a_run_ended_after_a_stall_past_the_lease_is_logged_as_lost_not_done(
    pg_dsn: str, daemons: DaemonFactory, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    # --no-auth: /metrics of each daemon is open
    args = ("--lease", "2", "--max-batch", "1", "--no-auth")
    [stalled], token = await start_fleet(daemons, pg_dsn, open_tmp, 1, *args)
    log = daemons.shared_dir() / "runs.txt"
    api = Api(session, stalled.url, CLIENT, token)
    await Handlers(api).add(JOBTYPE, "python", recording_handler(log, None), timeout=20)
    hold = log.parent / "hold"
    hold.touch()
    [job_id] = await api.add(JOBTYPE, [f"hold:{hold}"])

    async def started() -> bool | None:
        return True if any(r.job_id == job_id for r in read_runs(log)) else None

    await until(started, 20, "the first daemon to start the job", interval=0.05)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        hold.unlink()  # its run ends while the daemon is stopped and cannot hear it
        survivor = daemons.start(open_tmp / "data-survivor", pg_dsn, *args)
        other = api.at(survivor.url)
        job = await wait_done(other, job_id, within=30)
        assert (job["code"], job["exitcode"]) == ("ok", 200), job
    finally:
        os.kill(stalled.pid, signal.SIGCONT)

    def lines(daemon_dir: Path, ev: str) -> list[dict[str, object]]:
        records = []
        for path in daemon_dir.glob("queue-*.log"):
            for text in path.read_text().splitlines():
                record = json.loads(text)
                if record["ev"] == ev and record.get("id") == job_id:
                    records.append(record)
        return records

    async def refused() -> list[dict[str, object]] | None:
        return lines(stalled.data_dir, "lost-lease") or None

    [lost] = await until(refused, 20, "the stalled daemon to log its late run as lost")
    assert lost["code"] == "ok"
    assert lines(stalled.data_dir, "finished") == [], "a refused release was logged as done"
    assert len(lines(survivor.data_dir, "finished")) == 1
    late, fresh = await scrape(api), await scrape(other)
    assert value(late, "queue_jobs_lost_lease_total", tenant=CLIENT, type=JOBTYPE) == 1
    finished = "queue_jobs_finished_total"
    assert value(late, finished, tenant=CLIENT, type=JOBTYPE, code="ok") == 0
    assert value(fresh, finished, tenant=CLIENT, type=JOBTYPE, code="ok") == 1
    assert_no_overlapping_runs(read_runs(log))

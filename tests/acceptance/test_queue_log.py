"""The queue logfile of a real daemon (docs/queuelog.md):
a line for every event of each job's life with the documented fields, nothing
lost or torn by SIGTERM, rotated files included, and ``queue-daemon stats``
counting it right."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from harness.api import Handlers, until, wait_all_done
from harness.daemons import DaemonFactory, deploy, run_cli

CLIENT = "logs"
HANDLER = (
    "import time\n"
    "def handler(payload, ctx):\n"
    "    if payload == 'slow':\n"
    "        time.sleep(0.3)\n"
    "        return 200, 'slept'\n"
    "    if payload == 'flaky':\n"
    "        return (503, 'later') if ctx.attempt == 1 else (200, 'now')\n"
    "    return int(payload), 'r'\n"
)
COMMON = {"ev", "t", "tenant", "type"}
FIELDS = {
    "added": COMMON | {"id", "size", "sysid", "dt"},
    "started": COMMON | {"id", "attempt", "sysid", "wait_ms"},
    "finished": COMMON | {"id", "attempt", "sysid", "code", "exitcode", "run_ms", "how"},
    "retry": COMMON | {"id", "attempt", "sysid", "code", "exitcode", "delay_ms", "dt"},
    "cancelled": COMMON | {"id", "sysid"},
}
BULK = 400


def log_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("queue-*.log*"))


def read_lines(paths: list[Path]) -> list[bytes]:
    lines: list[bytes] = []
    for path in paths:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        assert not data or data.endswith(b"\n"), f"{path.name} ends in a partial line"
        lines += data.splitlines()
    return lines


def events_by_job(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    jobs: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["t"]):
        if "id" in r:
            jobs.setdefault(r["id"], []).append(r)
    return jobs


async def test_the_log_has_each_event_of_a_jobs_life_and_stats_counts_it(
    pg_dsn: str, daemons: DaemonFactory, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    # a small size limit: the daemon rotates (and gzips) while the test runs
    deployed = deploy(
        daemons,
        pg_dsn,
        open_tmp,
        [CLIENT],
        "--lease",
        "10",
        "--logfile-max-bytes",
        "4096",
        "--logfile-gzip",
    )
    api = deployed.api(session, CLIENT)
    await Handlers(api).add("codes", "python", HANDLER, maxAttempts=3, timeout=10)
    await Handlers(api).add("bulk", "python", HANDLER, timeout=10)

    ran = await api.add("codes", ["200", "201", "204", "404", "slow", "flaky"])
    later = await api.add("codes", ["200"], params={"delay": "3600"})

    async def cancelled() -> bool | None:
        reply = await api.cancel(later[0])  # 404 until the ingester stored it
        assert reply.status in (200, 404), reply
        return True if reply.status == 200 else None

    await until(cancelled, 30, "the delayed job to be cancelled")
    done = await wait_all_done(api, ran, within=60)
    assert done[ran[-1]]["attempts"] == 2 and done[ran[-1]]["code"] == "ok"

    # many more, then SIGTERM at once: whatever was logged in memory must reach the file
    bulk = await api.add("bulk", ["200"] * BULK)
    assert deployed.daemon.terminate() == 0

    files = log_files(deployed.data_dir)
    assert any(f.name.endswith(".gz") for f in files), [f.name for f in files]
    records = [orjson.loads(raw) for raw in read_lines(files)]
    for r in records:
        assert r["tenant"] == CLIENT, r
        assert FIELDS.get(r["ev"], COMMON) <= r.keys(), r
    jobs = events_by_job(records)

    def life(job_id: str) -> list[tuple[str, Any]]:
        return [(r["ev"], r.get("how") or r.get("code")) for r in jobs[job_id]]

    for job_id, code in zip(ran[:5], ["ok", "ok", "ok", "failed", "ok"], strict=True):
        assert life(job_id) == [("added", None), ("started", None), ("finished", "archive")]
        finished = jobs[job_id][-1]
        assert (finished["code"], finished["attempt"]) == (code, 1)
        assert finished["run_ms"] >= 0 and jobs[job_id][1]["wait_ms"] >= 0
    assert jobs[ran[4]][-1]["run_ms"] >= 250  # the handler slept 0.3 s
    assert life(ran[5]) == [
        ("added", None),
        ("started", None),
        ("finished", "retry"),
        ("retry", "error"),
        ("started", None),
        ("finished", "archive"),
    ]
    second_start = jobs[ran[5]][4]
    assert second_start["attempt"] == 2
    # it waited from when its retry was due, not from its creation
    created = jobs[ran[5]][0]["t"]
    assert second_start["wait_ms"] < second_start["t"] - created
    assert life(later[0]) == [("added", None), ("cancelled", None)]
    assert jobs[later[0]][0]["dt"] - jobs[later[0]][0]["t"] >= 3_599_000

    # SIGTERM: every acknowledged job was logged, and every run that started ended
    assert all(jobs[job_id][0]["ev"] == "added" for job_id in bulk)
    for job_id in bulk:
        starts = sum(r["ev"] == "started" for r in jobs[job_id])
        ends = sum(r["ev"] == "finished" for r in jobs[job_id])
        assert starts == ends, jobs[job_id]

    stats = run_cli("stats", "--json", *map(str, files), cwd=deployed.cwd)
    assert stats.returncode == 0, stats.stderr
    report = orjson.loads(stats.stdout)
    assert report["bad_lines"] == 0
    groups = {g["type"]: g for g in report["groups"]}
    codes = groups["codes"]
    assert codes["added"] == 7
    assert codes["done"] == {"ok": 5, "failed": 1, "error": 0, "retry": 0}
    assert (codes["cancelled"], codes["retries"], codes["started"]) == (1, 1, 7)
    assert codes["wait_ms"]["n"] == 7 and codes["run_ms"]["n"] == 7
    assert codes["run_ms"]["p99"] >= 250  # the slow job
    assert groups["bulk"]["added"] == BULK
    bulk_ok = sum(1 for job_id in bulk if jobs[job_id][-1].get("how") == "archive")
    assert groups["bulk"]["done"]["ok"] == bulk_ok

    table = run_cli("stats", *map(str, files), "--tenant", CLIENT, cwd=deployed.cwd)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:2] == ["tenant", "type"]

"""Held results (runners/PROTOCOL.md): a python context writes the results of quick
jobs a group at a time, and the daemon reads back the group it did not send
when the context dies or is killed, so each job keeps its own outcome."""

from __future__ import annotations

import re

from queue_daemon.runners.pool import RunnerPool
from tests.integration.test_runner_python import jobs, pool, spec

__all__ = ["pool"]  # a fixture

QUICK = 300  # jobs before the one that stops the context: enough to be held


# the handler says, on stderr, how many bytes of results its context held when it stopped
HELD_NOW = (
    "def held_now():\n"
    "    with open('.qd-held', 'rb') as f:\n"
    "        return int.from_bytes(f.read(4), 'little')\n"
)


def held_bytes(reason: str | None) -> int:
    found = re.search(r"held (\d+)", reason or "")
    assert found, reason
    return int(found.group(1))


async def test_quick_jobs_each_get_their_result(pool: RunnerPool) -> None:
    results = await pool.run_batch(
        spec("def handler(p, ctx):\n    return p\n"), jobs(*map(str, range(2000)))
    )
    assert [(r.id, r.exitcode, r.result) for r in results] == [
        (f"id-{i}", 200, str(i)) for i in range(2000)
    ]
    assert all(r.run_ms is not None and r.run_ms >= 0 for r in results)


async def test_a_crash_keeps_the_held_results_and_blames_the_right_job(pool: RunnerPool) -> None:
    body = HELD_NOW + (
        "import os, sys\n"
        "def handler(p, ctx):\n"
        "    if p == 'crash':\n"
        "        sys.stderr.write(f'held {held_now()}\\n')\n"
        "        os._exit(3)\n"
        "    return p\n"
    )
    payloads = [str(i) for i in range(QUICK)] + ["crash", "later"]
    results = await pool.run_batch(spec(body), jobs(*payloads))
    assert [(r.exitcode, r.result) for r in results[:QUICK]] == [
        (200, str(i)) for i in range(QUICK)
    ]
    crashed = results[QUICK]
    assert (crashed.exitcode, crashed.ran) == (500, True)
    assert held_bytes(crashed.result) > 0  # results were held when it died, and came back
    assert (results[-1].exitcode, results[-1].ran) == (100, False)


async def test_a_timeout_blames_the_job_that_ran_too_long(pool: RunnerPool) -> None:
    body = HELD_NOW + (
        "import sys\n"
        "def handler(p, ctx):\n"
        "    if p == 'spin':\n"
        "        sys.stderr.write(f'held {held_now()}\\n')\n"
        "        sys.stderr.flush()\n"
        "        while True: pass\n"
        "    return p\n"
    )
    payloads = [str(i) for i in range(QUICK)] + ["spin", "never"]
    results = await pool.run_batch(spec(body, timeout=1.0), jobs(*payloads))
    assert [(r.exitcode, r.result) for r in results[:QUICK]] == [
        (200, str(i)) for i in range(QUICK)
    ]
    assert (results[QUICK].exitcode, results[QUICK].result) == (504, "timed out after 1s")
    assert (results[-1].exitcode, results[-1].ran) == (100, False)


async def test_a_forged_held_file_is_read_as_no_results(pool: RunnerPool) -> None:
    # the handler overwrites what its context holds (its own process may): the
    # daemon reads nothing it cannot match to the batch, and stops cleanly
    body = (
        "import os\n"
        "def handler(p, ctx):\n"
        "    if p == 'forge':\n"
        "        with open('.qd-held', 'r+b') as f:\n"
        "            f.write((60000).to_bytes(4, 'little') + b'\\xff' * 60000)\n"
        "        os._exit(3)\n"
        "    if p == 'lie':\n"
        "        with open('.qd-held', 'r+b') as f:\n"
        "            f.write((0xFFFFFFF0).to_bytes(4, 'little'))\n"
        "        os._exit(3)\n"
        "    return p\n"
    )
    for bad in ("forge", "lie"):
        payloads = [str(i) for i in range(QUICK)] + [bad, "later"]
        results = await pool.run_batch(spec(body), jobs(*payloads))
        assert [r.id for r in results] == [f"id-{i}" for i in range(QUICK + 2)]
        stopped = [r for r in results if r.exitcode == 500]
        assert len(stopped) == 1 and stopped[0].result is not None
        assert stopped[0].result.startswith("context died")
        ok = [r for r in results if r.exitcode == 200]
        assert [r.result for r in ok] == [str(i) for i in range(len(ok))]
        assert all(not r.ran for r in results if r.exitcode == 100)

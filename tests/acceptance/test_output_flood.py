"""A flood of handler output costs the daemon little and other tenants nothing.

``yes "" >&2`` writes empty lines as fast as a core can: the daemon reads a
tenant's output in bulk and at most ``--output-rate`` bytes a second, so the
flooding handlers wait on their own full pipes instead of the daemon spending
a core on them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Handlers, wait_all_done, wait_done
from harness.daemons import DaemonFactory, Deployment, deployed_where_handlers_reach

FLOODS = {
    "shell_stderr": ("shell", 'timeout 4 yes "" >&2'),
    "shell_stdout": ("shell", 'timeout 4 yes ""'),
    "python_stderr": (
        "python",
        "import sys, time\n"
        "def handler(p, ctx):\n"
        "    end = time.monotonic() + 4\n"
        "    while time.monotonic() < end:\n"
        "        sys.stderr.write('\\n' * 65536)\n",
    ),
}


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    with deployed_where_handlers_reach(
        daemons, pg_dsn, "qd-output-", ["noisy", "calm"]
    ) as deployed:
        yield deployed


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_an_output_flood_costs_the_daemon_little_and_others_nothing(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    noisy, calm = deployment.api(session, "noisy"), deployment.api(session, "calm")
    for name, (lang, body) in FLOODS.items():
        await Handlers(noisy).add(name, lang, body, timeout=10, maxAttempts=1)
    await Handlers(calm).add("quick", "shell", "echo 'S: 200 fine'")
    [warm] = await calm.add("quick", ["warm"])
    await wait_done(calm, warm)
    pid = deployment.daemon.pid
    began, cpu_before = time.monotonic(), cpu_seconds(pid)
    flood_ids = [i for name in FLOODS for i in await noisy.add(name, ["1", "2", "3"])]
    calm_ids = []
    while time.monotonic() - began < 4:
        calm_ids += await calm.add("quick", ["x"])
        await asyncio.sleep(0.2)
    done = await wait_all_done(noisy, flood_ids, within=60)
    used = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - began)
    # (it used 97% before output was read in bulk and within a budget; 26% after)
    assert used < 0.5, f"the daemon used {used:.0%} of a core while handlers flooded output"
    calm_done = await wait_all_done(calm, calm_ids, within=30)
    assert all(job["result"] == "fine" for job in calm_done.values())
    assert all(job["state"] == "done" for job in done.values())


# Each prints 15 MiB of empty lines in a few hundredths of a second: what the
# daemon makes of a job's output must cost it no step per line.
PRINTERS = {
    "python_print": (
        "python",
        "import sys\n"
        "def handler(p, ctx):\n"
        "    for _ in range(15):\n"
        "        sys.stdout.write('\\n' * (1 << 20))\n"
        "    print('S: 200 printed')\n",
    ),
    "node_print": (
        "node",
        "module.exports = () => {\n"
        "  for (let i = 0; i < 15; i++) process.stdout.write('\\n'.repeat(1 << 20));\n"
        "  console.log('S: 200 printed');\n"
        "};\n",
    ),
    "shell_print": ("shell", "head -c 16000000 /dev/zero | tr '\\0' '\\n'; echo 'S: 200 printed'"),
}


@pytest.fixture
def unthrottled(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    """A daemon that reads as much output as handlers print (no --output-rate)."""
    with deployed_where_handlers_reach(
        daemons, pg_dsn, "qd-output-", ["noisy", "calm"], "--output-rate", "0"
    ) as deployed:
        yield deployed


async def test_printed_lines_cost_the_daemon_no_step_each(
    unthrottled: Deployment, session: aiohttp.ClientSession
) -> None:
    """Even read at once, millions of printed lines cost the daemon a few passes over
    their bytes, not a step each: its CPU stays low, the jobs' status lines count."""
    deployment = unthrottled
    noisy, calm = deployment.api(session, "noisy"), deployment.api(session, "calm")
    for name, (lang, body) in PRINTERS.items():
        await Handlers(noisy).add(name, lang, body, timeout=30, maxAttempts=1)
    await Handlers(calm).add("quick", "shell", "echo 'S: 200 fine'")
    [warm] = await calm.add("quick", ["warm"])
    await wait_done(calm, warm)
    pid = deployment.daemon.pid
    cpu_before = cpu_seconds(pid)
    printed = [i for name in PRINTERS for i in await noisy.add(name, ["1", "2", "3"])]
    calm_ids = await calm.add("quick", ["x"] * 5)
    done = await wait_all_done(noisy, printed, within=120)
    used = cpu_seconds(pid) - cpu_before
    # 9 jobs of 15 MiB of lines: about 3 s of the daemon's CPU each when it took
    # them a line at a time (28 s in all), 0.7-1.1 s in all since
    assert used < 4.0, f"the daemon used {used:.1f} s of CPU on 9 jobs' printed lines"
    assert all(job["result"] == "printed" for job in done.values()), done
    calm_done = await wait_all_done(calm, calm_ids, within=30)
    assert all(job["result"] == "fine" for job in calm_done.values())

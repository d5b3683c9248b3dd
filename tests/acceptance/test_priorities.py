"""Priorities (docs/api.md): among the due jobs of a type the higher priority
runs (or is claimed) first, then the oldest; anything but an integer from -100
to 100 is refused. One real daemon running one job at a time."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import (
    Api,
    Handlers,
    assert_error,
    claim_jobs,
    pulled_type,
    until,
    wait_all_done,
)
from harness.daemons import DaemonFactory, Deployment, deploy

# the run's moment on the machine's monotonic clock (one for every process)
WHEN = "import time\ndef handler(p, ctx):\n    return f'{time.monotonic_ns()} {p}'\n"


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("priorities")
    deployed = deploy(module_daemons, module_dsn, root, ["p"], "--concurrency", "1")
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def p(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "p")


async def _post(api: Api, path: str) -> None:
    reply = await api.request("POST", path)
    assert reply.status == 200, reply


async def _add_mixed(api: Api, jobtype: str) -> dict[str, str]:
    """Plain, low and high jobs, the high ones added last: id -> payload, once
    all are in the store (an add is answered when its journal has it)."""
    added: dict[str, str] = {}
    for payloads, priority in ((["p1", "p2"], None), (["l1"], "-5"), (["h1", "h2"], "50")):
        params = None if priority is None else {"priority": priority}
        ids = await api.add(jobtype, payloads, params=params)
        added.update(zip(ids, payloads, strict=True))

    async def stored() -> bool | None:
        counts = (await api.stats()).json["types"].get(jobtype, {})
        return True if counts.get("waiting") == len(added) else None

    await until(stored, 30, f"the jobs of {jobtype} in the store")
    return added


async def test_a_daemon_runs_the_higher_priority_first(p: Api) -> None:
    await Handlers(p).add("ordered", "python", WHEN)
    await _post(p, "/p/type/ordered/pause")
    added = await _add_mixed(p, "ordered")
    await _post(p, "/p/type/ordered/resume")
    done = await wait_all_done(p, list(added))
    ran = sorted(done.values(), key=lambda job: int(job["result"].split()[0]))
    assert [job["payload"] for job in ran] == ["h1", "h2", "p1", "p2", "l1"]
    assert {job["payload"]: job["priority"] for job in ran} == {
        "h1": 50,
        "h2": 50,
        "p1": 0,
        "p2": 0,
        "l1": -5,
    }


async def test_a_pull_worker_claims_the_higher_priority_first(p: Api) -> None:
    await pulled_type(p, "pulled")
    await _add_mixed(p, "pulled")
    jobs = await claim_jobs(p, "pulled", "w1", limit=10)
    assert [job["payload"] for job in jobs] == ["h1", "h2", "p1", "p2", "l1"]


@pytest.mark.parametrize("bad", ["", "x", "1.5", "101", "-101", "1e2", " 1", "0x10", "99999999"])
async def test_a_priority_that_is_not_an_integer_in_range_is_refused(p: Api, bad: str) -> None:
    reply = await p.add_raw("ordered", "x\n", params={"priority": bad})
    body = assert_error(reply, 400, "bad_request")
    assert "priority must be an integer from -100 to 100" in body["message"], body

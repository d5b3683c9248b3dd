"""Concurrency keys (docs/api.md): ``?key=K`` on an add, and a handler's
``keyConcurrency`` caps how many jobs of one key run at once, daemon-run or
pulled; bad keys and caps are refused. One real daemon with four slots."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import (
    Api,
    Handlers,
    assert_error,
    claim_jobs,
    post_json,
    pulled_type,
    until,
    wait_all_done,
)
from harness.daemons import DaemonFactory, Deployment, deploy

# each run's start and end on the machine's monotonic clock (one for every process)
SPAN = (
    "import time\n"
    "def handler(p, ctx):\n"
    "    start = time.monotonic_ns()\n"
    "    time.sleep(0.15)\n"
    "    return f'{start} {time.monotonic_ns()}'\n"
)


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("keys")
    deployed = deploy(module_daemons, module_dsn, root, ["k"], "--concurrency", "4")
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def k(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "k")


async def test_jobs_of_one_key_never_run_together(k: Api) -> None:
    await Handlers(k).add("spans", "python", SPAN, keyConcurrency=1)
    ids: dict[str, str] = {}
    for key in ("acct-1", "acct-2"):
        for n in range(4):
            (job_id,) = await k.add("spans", [f"{key}/{n}"], params={"key": key})
            ids[job_id] = key
    done = await wait_all_done(k, list(ids), within=60)
    for key in ("acct-1", "acct-2"):
        spans = sorted(
            tuple(int(t) for t in job["result"].split())
            for job_id, job in done.items()
            if ids[job_id] == key
        )
        assert len(spans) == 4
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"two jobs of {key} ran at once: {spans}"
    assert {job["key"] for job in done.values()} == {"acct-1", "acct-2"}
    assert all(job["code"] == "ok" for job in done.values()), done


async def test_a_pull_worker_gets_no_more_of_a_key_than_its_cap(k: Api) -> None:
    await pulled_type(k, "pulled", keyConcurrency=2)
    for key, n in (("a", 5), ("b", 1)):
        await k.add("pulled", [f"{key}{i}" for i in range(n)], params={"key": key})
    await k.add("pulled", ["free0", "free1"])

    async def stored() -> bool | None:  # an add is answered when its journal has it
        counts = (await k.stats()).json["types"].get("pulled", {})
        return True if counts.get("waiting") == 8 else None

    await until(stored, 30, "the jobs in the store")
    jobs = await claim_jobs(k, "pulled", "w1", limit=20)
    assert sorted(job["payload"] for job in jobs) == ["a0", "a1", "b0", "free0", "free1"]
    assert {job["payload"]: job["key"] for job in jobs}["a0"] == "a"
    assert await claim_jobs(k, "pulled", "w2", limit=20, wait=0) == []
    a0 = next(job for job in jobs if job["payload"] == "a0")
    reply = await post_json(k, f"/job/{a0['id']}/complete", {"worker": "w1", "claim": a0["claim"]})
    assert reply.status == 200, reply
    after = await claim_jobs(k, "pulled", "w2", limit=20)
    assert [job["payload"] for job in after] == ["a2"]


@pytest.mark.parametrize("bad", ["", "x" * 201, "tab\there", "new\nline", "nul\x00", "bell\x07"])
async def test_a_key_that_is_not_1_to_200_printable_characters_is_refused(k: Api, bad: str) -> None:
    reply = await k.add_raw("spans", "x\n", params={"key": bad})
    body = assert_error(reply, 400, "bad_request")
    assert "key must be 1 to 200 printable characters" in body["message"], body


async def test_a_key_may_hold_any_printable_character(k: Api) -> None:
    key = "ключ;|=&/ é x" + "y" * 187
    assert len(key) == 200
    (job_id,) = await k.add("unrun", ["x"], params={"key": key})

    async def stored() -> dict[str, object] | None:
        reply = await k.get_job(job_id)
        return reply.json if reply.status == 200 else None

    job = await until(stored, 30, "the job in the store")
    assert job["key"] == key


@pytest.mark.parametrize("bad", [0, -1, 10_001, 1.5, "2", True])
async def test_a_key_concurrency_that_is_not_an_integer_in_range_is_refused(
    k: Api, bad: object
) -> None:
    reply = await Handlers(k).add_raw(
        "capped", {"lang": "python", "body": SPAN, "keyConcurrency": bad}
    )
    body = assert_error(reply, 400, "bad_handler")
    assert "keyConcurrency must be an integer from 1 to 10000" in body["message"], body

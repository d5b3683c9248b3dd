"""docs/api.md's Jobs section end to end: one real daemon on a real PostgreSQL for the module.

Each test uses its own jobtypes (or tenant), so tests sharing the daemon never
see each other's jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import pytest

from harness.api import JOB_FIELDS, STAT_FIELDS, Api, Handlers, assert_error, wait_done
from harness.daemons import DaemonFactory, Deployment, add_tenant, deploy
from tests.acceptance.storecheck import payloads

SLACK = timedelta(seconds=60)  # between the test's clock and the daemon's, plus run time


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("api"), ["api", "lister"])
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def api(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "api")


def when(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    assert parsed.tzinfo is not None, f"{text} has no time zone"
    return parsed


def near(text: str, expected: datetime) -> bool:
    return abs(when(text) - expected) < SLACK


async def test_text_lines_are_jobs_with_and_without_final_newline(
    api: Api, deployment: Deployment
) -> None:
    bodies = {
        "final newline": ("a\nb|c\n", ["a", "b|c"]),
        "no final newline": ('x\n{"k": "v"}', ["x", '{"k": "v"}']),
        "CRLF": ("p\r\nq r\r\n", ["p", "q r"]),
        "one line, unicode": ("é ✓ 日本\n", ["é ✓ 日本"]),
        # separators of str.splitlines() that are not newlines; spaces and tabs kept as sent
        "not line breaks": (
            "a\u2028b\nc\x85d\ne\x0bf\x0cg\x1ch\n i\tj \nk\rl\n",
            ["a\u2028b", "c\x85d", "e\x0bf\x0cg\x1ch", " i\tj ", "k\rl"],
        ),
    }
    sent: dict[str, str] = {}
    for name, (body, lines) in bodies.items():
        reply = await api.add_raw("text", body)
        assert reply.status == 200, f"{name}: {reply}"
        assert reply.content_type == "application/json"
        ids = reply.json["ids"]
        assert len(ids) == len(lines), f"{name}: {reply}"
        sent.update(zip(ids, lines, strict=True))
    assert len(sent) == 12, "ids must be unique"
    for job_id in sent:
        job = await api.wait_job(job_id)
        assert job["id"] == job_id
        assert job["type"] == "text"
    assert await payloads(deployment.dsn, sent) == sent


async def test_json_array_elements_are_jobs_as_compact_json(
    api: Api, deployment: Deployment
) -> None:
    body = '[{"a": 1, "b": [1, 2]}, "x\\ny", 3, null, [true, "z"], "é"]'
    expected = ['{"a":1,"b":[1,2]}', '"x\\ny"', "3", "null", '[true,"z"]', '"é"']
    sent: dict[str, str] = {}
    for content_type in ("application/json", "application/json; charset=utf-8"):
        reply = await api.add_raw("json", body, content_type=content_type)
        assert reply.status == 200, f"{content_type}: {reply}"
        sent.update(zip(reply.json["ids"], expected, strict=True))
    for job_id in sent:
        await api.wait_job(job_id)
    assert await payloads(deployment.dsn, sent) == sent


async def test_json_numbers_keep_their_value(api: Api, deployment: Deployment) -> None:
    """Compact JSON of an element is that element: big integers are not rounded to floats."""
    body = '[123456789012345678901234567890, {"n": 18446744073709551616}, -9223372036854775809]'
    expected = ["123456789012345678901234567890", '{"n":18446744073709551616}']
    expected.append("-9223372036854775809")
    reply = await api.add_raw("bigint", body, content_type="application/json")
    assert reply.status == 200, reply
    sent = dict(zip(reply.json["ids"], expected, strict=True))
    for job_id in sent:
        await api.wait_job(job_id)
    assert await payloads(deployment.dsn, sent) == sent


async def test_get_job_has_the_documented_shape(api: Api) -> None:
    before = datetime.now(UTC)
    [job_id] = await api.add("shape.v1:x-y_z", ["payload"])
    job = await api.wait_job(job_id)
    assert job.keys() >= JOB_FIELDS, f"missing {JOB_FIELDS - job.keys()}"
    assert job["id"] == job_id
    assert job["type"] == "shape.v1:x-y_z", "the type is the tenant's, without the client prefix"
    assert job["state"] == "waiting"
    assert job["attempts"] == 0
    for unset in ("done_dt", "code", "exitcode", "result"):
        assert job[unset] is None, f"{unset} of a new job: {job}"
    assert near(job["create_dt"], before)
    assert when(job["dt"]) <= when(job["create_dt"]) + timedelta(seconds=1)


async def test_delay_and_dt_schedule_jobs_in_the_future(api: Api) -> None:
    now = datetime.now(UTC)
    in_2h = now + timedelta(hours=2)
    in_3h = now + timedelta(hours=3)
    in_5h = now + timedelta(hours=5)
    cases: list[tuple[dict[str, str], datetime]] = [
        ({"delay": "3600"}, now + timedelta(hours=1)),
        ({"delay": "90.5"}, now + timedelta(seconds=90.5)),
        ({"dt": in_2h.isoformat().replace("+00:00", "Z")}, in_2h),
        ({"dt": str(int(in_3h.timestamp() * 1000))}, in_3h),
        # an offset other than UTC ('+' must survive the query string)
        ({"dt": in_5h.astimezone(timezone(timedelta(hours=2))).isoformat()}, in_5h),
    ]
    for params, expected in cases:
        [job_id] = await api.add("later", ["x"], params=params)
        job = await api.wait_job(job_id)
        assert job["state"] == "waiting", f"{params}: {job}"
        assert near(job["dt"], expected), f"{params}: dt {job['dt']}, expected {expected}"
        if "dt" in params:
            assert abs(when(job["dt"]) - expected) < timedelta(milliseconds=2), (params, job)
    [now_id] = await api.add("later", ["now"], params={"delay": "0"})
    await api.wait_job(now_id)
    stats = await api.type_stats("later")
    assert stats is not None
    assert stats["scheduled"] == len(cases), stats
    assert stats["waiting"] == 1, stats


async def test_list_is_newest_first_with_paging_and_filters(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    lister = deployment.api(session, "lister")
    added: list[tuple[str, str]] = []  # (id, type) in the order the daemon accepted them
    for jobtype, n in (("t1", 2), ("t2", 3), ("t1", 2), ("t2", 1)):
        ids = await lister.add(jobtype, [f"{jobtype}-{i}" for i in range(n)])
        added += [(i, jobtype) for i in ids]
    for job_id, _ in added:
        await lister.wait_job(job_id)
    newest_first = [i for i, _ in reversed(added)]

    pages: list[list[str]] = []
    after: dict[str, str] = {}
    while True:
        reply = await lister.jobs(limit="3", **after)
        assert reply.status == 200, reply
        assert reply.content_type == "application/json"
        page = reply.json
        assert len(page["jobs"]) <= 3
        assert all(job.keys() >= JOB_FIELDS for job in page["jobs"])
        pages.append([job["id"] for job in page["jobs"]])
        if page["next"] is None:
            break
        assert isinstance(page["next"], str)
        after = {"after": page["next"]}
        assert len(pages) < 10, "paging does not end"
    assert [i for p in pages for i in p] == newest_first
    assert [len(p) for p in pages] == [3, 3, 2]

    t1 = [job["id"] for job in await lister.all_jobs(type="t1", limit="1")]
    assert t1 == [i for i, t in reversed(added) if t == "t1"]
    assert all(job["type"] == "t2" for job in await lister.all_jobs(type="t2"))

    cancelled = added[1][0]
    assert (await lister.cancel(cancelled)).status == 200
    done = [job["id"] for job in await lister.all_jobs(state="done")]
    assert done == [cancelled]
    waiting = [job["id"] for job in await lister.all_jobs(state="waiting", limit="2")]
    assert waiting == [i for i in newest_first if i != cancelled]
    assert await lister.all_jobs(state="running") == []
    done_t2 = await lister.all_jobs(state="done", type="t2")
    assert done_t2 == [], "filters combine"

    reply = await lister.jobs(limit="1")
    assert [job["id"] for job in reply.json["jobs"]] == newest_first[:1]
    assert reply.json["next"] is not None


async def test_stats_count_each_state_per_type(api: Api) -> None:
    now_ids = await api.add("counted", ["1", "2", "3", "4"])
    later_ids = await api.add("counted", ["5", "6"], params={"delay": "600"})
    other = await api.add("counted.other", ["7"])
    for job_id in now_ids + later_ids + other:
        await api.wait_job(job_id)
    assert (await api.cancel(now_ids[0])).status == 200
    assert (await api.cancel(later_ids[0])).status == 200

    reply = await api.stats()
    assert reply.status == 200 and reply.content_type == "application/json", reply
    types = reply.json["types"]
    for name in ("counted", "counted.other"):
        assert set(types[name]) == STAT_FIELDS, types[name]
    assert types["counted"] == {
        "waiting": 3,
        "scheduled": 1,
        "blocked": 0,
        "running": 0,
        "done_ok": 0,
        "done_failed": 2,
        "done_error": 0,
        "paused": False,
    }
    assert types["counted.other"]["waiting"] == 1
    assert sum(types["counted.other"].values()) == 1  # (False counts 0)


async def test_cancel_a_waiting_job_then_again_is_409(api: Api) -> None:
    [job_id, scheduled_id] = await api.add("cancel", ["x"]) + await api.add(
        "cancel", ["y"], params={"delay": "600"}
    )
    for target in (job_id, scheduled_id):
        await api.wait_job(target)
        reply = await api.cancel(target)
        assert reply.status == 200, reply
        assert reply.content_type == "application/json"
        for job in (reply.json, (await api.get_job(target)).json):
            assert job["id"] == target
            assert job["state"] == "done", job
            assert job["code"] == "failed", job
            assert job["exitcode"] == 499, job
            assert job["done_dt"] is not None, job
            assert near(job["done_dt"], datetime.now(UTC))
            assert job["dt"] is None, job  # not the store's mark a thousand years ahead
        assert_error(await api.cancel(target), 409)
    stats = await api.type_stats("cancel")
    assert stats is not None and stats["done_failed"] == 2 and stats["waiting"] == 0, stats


async def test_unknown_job_is_404(api: Api) -> None:
    assert_error(await api.get_job("0000000000000-nosuch"), 404)
    assert_error(await api.cancel("0000000000000-nosuch"), 404)


async def test_healthz_reports_ingest_lag(api: Api) -> None:
    reply = await api.healthz()
    assert reply.status == 200, reply
    assert reply.content_type == "application/json"
    body = reply.json
    assert isinstance(body["ingest_lag"], dict), body
    assert isinstance(body["ingest_lag"]["lines"], int), body
    assert isinstance(body["sysid"], str) and body["sysid"], body
    [job_id] = await api.add("health", ["x"])
    await api.wait_job(job_id)
    caught_up = await api.wait_caught_up()
    assert caught_up["ingest_lag"]["lines"] == 0


def test_the_daemon_logged_no_error(deployment: Deployment) -> None:
    log = deployment.daemon.stderr_text()
    assert "Traceback" not in log, log[-3000:]
    assert " ERROR " not in log, log[-3000:]


async def test_done_jobs_are_deleted_early_bounded_and_only_the_tenants(
    daemons: DaemonFactory, pg_dsn: str, open_tmp: Path, session: aiohttp.ClientSession
) -> None:
    tokens = {c: add_tenant(c, store=pg_dsn, data_dir=open_tmp, cwd=open_tmp) for c in ("d", "e")}
    url = daemons.start(open_tmp, pg_dsn).url
    mine, theirs = Api(session, url, "d", tokens["d"]), Api(session, url, "e", tokens["e"])
    for api in (mine, theirs):
        await Handlers(api).add("gone", "shell", "true")
        await Handlers(api).add("kept", "shell", "true")
    done = await mine.add("gone", [str(n) for n in range(30)])
    kept = await mine.add("kept", ["k"])
    [waiting] = await mine.add("gone", ["later"], params={"delay": "600"})
    others = await theirs.add("gone", ["o1", "o2"])
    for api, ids in ((mine, done + kept), (theirs, others)):
        for job_id in ids:
            await wait_done(api, job_id, within=60)
    path = "/d/jobs/delete"
    for bad in (
        {},
        {"state": "waiting"},
        {"state": "done", "type": "bad type"},
        {"state": "done", "before": "soon"},
    ):
        assert_error(await mine.request("POST", path, params=bad), 400)
    earlier = await mine.request("POST", path, params={"state": "done", "before": "2001-01-01"})
    assert earlier.json == {"deleted": 0, "more": False}, earlier
    reply = await mine.request("POST", path, params={"state": "done", "type": "gone"})
    assert reply.status == 200 and reply.json == {"deleted": 30, "more": False}, reply
    assert (await mine.get_job(done[0])).status == 404
    assert (await mine.get_job(kept[0])).json["state"] == "done"
    assert (await mine.get_job(waiting)).json["state"] == "waiting"
    assert [(await theirs.get_job(i)).status for i in others] == [200, 200]
    stats = (await mine.stats()).json["types"]
    assert stats["gone"]["done_ok"] == 0 and stats["gone"]["scheduled"] == 1, stats

"""Periodic jobs over HTTP (docs/api.md "Schedules"): each tick is one job however
many daemons share the store, an outage of every daemon ends in one catch-up
job, the listing shows the next fire times, and bad input is refused.

A schedule with a seconds field (``* * * * * *``) fires every second, so the
tests run for seconds, not minutes: ``QUEUE_TEST_SCHEDULE_SECONDS`` (default 12)
sets how long three daemons tick together, and ``QUEUE_TEST_OUTAGE_SECONDS``
(default 5) how long every daemon stays stopped.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from harness.api import Api, Reply, assert_error, until
from harness.daemons import DaemonFactory, add_tenant, run_cli, store_args
from queue_daemon.engine.admit.ids import tick_id
from queue_daemon.engine.schedule.cron import Cron
from tests.acceptance.scrape import scrape, value

EVERY_SECOND = "* * * * * *"
RUN_S = float(os.environ.get("QUEUE_TEST_SCHEDULE_SECONDS", "12"))
OUTAGE_S = float(os.environ.get("QUEUE_TEST_OUTAGE_SECONDS", "5"))


async def put(api: Api, name: str, fields: dict[str, Any]) -> Reply:
    return await api.request(
        "POST",
        f"/{api.client}/schedule/add/{name}",
        data=orjson.dumps(fields),
        headers={"Content-Type": "application/json"},
    )


async def add_schedule(api: Api, name: str, **fields: Any) -> dict[str, Any]:
    reply = await put(api, name, fields)
    assert reply.status == 200, reply
    body: dict[str, Any] = reply.json
    return body


async def listed(api: Api) -> dict[str, dict[str, Any]]:
    reply = await api.request("GET", f"/{api.client}/schedules")
    assert reply.status == 200, reply
    return {s["name"]: s for s in reply.json["schedules"]}


async def delete(api: Api, name: str) -> Reply:
    return await api.request("POST", f"/{api.client}/schedule/del/{name}")


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


async def stored_ids(dsn: str, stored_type: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT id FROM all_jobs WHERE type = $1", stored_type)
    finally:
        await conn.close()
    return {row["id"] for row in rows}


async def last_tick_in_store(dsn: str, client: str, name: str) -> datetime | None:
    conn = await asyncpg.connect(dsn)
    try:
        tick: datetime | None = await conn.fetchval(
            "SELECT last_tick FROM schedules WHERE client = $1 AND name = $2", client, name
        )
    finally:
        await conn.close()
    return tick


async def ticked_past(api: Api, name: str, moment: datetime, within: float) -> dict[str, Any]:
    """Poll the listing until the schedule's last tick added is at or after ``moment``."""

    async def probe() -> dict[str, Any] | None:
        schedule = (await listed(api)).get(name)
        assert schedule is not None
        tick = schedule["last_tick"]
        return schedule if tick is not None and when(tick) >= moment else None

    return await until(probe, within, f"schedule {name} to tick past {moment}", interval=0.2)


def tick_lines(data_dirs: list[Path]) -> list[dict[str, Any]]:
    """The ``tick`` lines of the daemons' queue logfiles."""
    lines = []
    for data_dir in data_dirs:
        for log in data_dir.glob("queue-*.log"):
            for raw in log.read_bytes().splitlines():
                record = orjson.loads(raw)
                if record["ev"] == "tick":
                    lines.append(record)
    return lines


async def test_three_daemons_add_one_job_per_tick(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path / "d0", cwd=tmp_path)
    dirs = [tmp_path / f"d{i}" for i in range(3)]
    started = [daemons.spawn(d, pg_dsn) for d in dirs]
    for daemon in started:
        daemon.wait_ready()
    apis = [Api(session, d.url, "t", token) for d in started]
    added = await add_schedule(apis[0], "beat", type="beat", cron=EVERY_SECOND, payload="tock")
    first = when(added["next"][0])
    await ticked_past(apis[1], "beat", first + timedelta(seconds=RUN_S), RUN_S + 30)
    assert (await delete(apis[2], "beat")).status == 200
    for api in apis:
        await api.wait_caught_up()
    for daemon in started:
        assert daemon.terminate() == 0  # its queue logfile written out
    # every job is a tick of the schedule (its id says which), so none has two
    horizon = int(RUN_S) + 60
    tick_of = {
        tick_id("t", "beat", added["version"], ms(first) + 1000 * i): i for i in range(horizon)
    }
    ids = await stored_ids(pg_dsn, "t-beat")
    assert ids and ids <= tick_of.keys(), ids - tick_of.keys()
    ticks = sorted(tick_of[i] for i in ids)
    assert ticks[0] == 0  # the first tick was added
    elapsed = ticks[-1] - ticks[0] + 1
    # a tick is skipped only when no daemon could add it for over a second (a
    # stalled machine): then the next stands for it
    assert len(ticks) >= elapsed - 2, f"{len(ticks)} jobs for {elapsed} ticks: {ticks}"
    assert len(ticks) >= RUN_S
    # one daemon journaled each: no tick line twice in the three queue logfiles
    lines = tick_lines(dirs)
    assert sorted(line["tick"] for line in lines) == sorted(ms(first) + 1000 * i for i in ticks), (
        "a tick journaled by two daemons, or a job without its tick line"
    )
    assert {line["id"] for line in lines} == ids


async def test_every_daemon_stopped_then_one_catchup_job(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path / "a", cwd=tmp_path)
    a = daemons.start(tmp_path / "a", pg_dsn)
    b = daemons.start(tmp_path / "b", pg_dsn)
    api = Api(session, a.url, "t", token)
    added = await add_schedule(api, "beat", type="beat", cron=EVERY_SECOND, payload="tock")
    first = when(added["next"][0])
    await ticked_past(api, "beat", first + timedelta(seconds=2), 30)
    assert a.terminate() == 0 and b.terminate() == 0
    stopped_at = datetime.now(UTC)
    last = await last_tick_in_store(pg_dsn, "t", "beat")
    assert last is not None
    await asyncio.sleep(OUTAGE_S)  # the outage itself: every daemon is down meanwhile
    back = daemons.start(tmp_path / "a", pg_dsn)
    restarted_at = datetime.now(UTC)
    api = api.at(back.url)
    await ticked_past(api, "beat", restarted_at + timedelta(seconds=2), 30)
    assert (await delete(api, "beat")).status == 200
    await api.wait_caught_up()
    version = added["version"]
    ids = await stored_ids(pg_dsn, "t-beat")
    missed = {
        tick_id("t", "beat", version, ms(last) + 1000 * i): last + timedelta(seconds=i)
        for i in range(1, int((restarted_at - last).total_seconds()) + 1)
    }
    assert len(missed) >= OUTAGE_S
    caught_up = ids & missed.keys()
    assert len(caught_up) == 1, f"{len(caught_up)} jobs for the ticks missed in the outage"
    # it is the latest missed tick (when a daemon was back), marked as a catch-up
    [job_id] = caught_up
    assert missed[job_id] >= stopped_at + timedelta(seconds=OUTAGE_S - 1)
    samples = await scrape(api.as_("*admin", admin_token(pg_dsn, tmp_path)))
    # (a later catch-up would need this daemon stalled for over a second)
    assert value(samples, "queue_schedule_ticks_total", tenant="t", catchup="true") >= 1
    [job_id] = caught_up
    job = (await api.get_job(job_id)).json
    assert (job["type"], job["payload"]) == ("beat", "tock")
    assert stopped_at + timedelta(seconds=OUTAGE_S) <= when(job["create_dt"])


def admin_token(dsn: str, cwd: Path) -> str:
    done = run_cli("admin", "token", *store_args(dsn, cwd), cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


async def test_listing_shows_the_next_fire_times_and_the_last_tick(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn).url, "t", token)
    nightly = await add_schedule(
        api, "nightly", type="report", cron="0 3 * * *", tz="Europe/Berlin", payload={"full": 1}
    )
    expected = Cron.parse("0 3 * * *", "Europe/Berlin").after(datetime.now(UTC), 3)
    assert [when(t) for t in nightly["next"]] == expected
    assert all(
        when(t).astimezone(Cron.parse("0 3 * * *", "Europe/Berlin").zone).hour == 3
        for t in nightly["next"]
    )
    assert (nightly["payload"], nightly["tz"], nightly["last_tick"]) == (
        '{"full":1}',
        "Europe/Berlin",
        None,
    )
    await add_schedule(api, "beat", type="beat", cron=EVERY_SECOND, payload="tock")
    beat = await ticked_past(api, "beat", datetime.now(UTC), 30)
    assert beat["last_job"] is not None and len(beat["next"]) == 3
    assert when(beat["next"][0]) > when(beat["last_tick"])
    job = await api.wait_job(beat["last_job"])
    assert (job["type"], job["payload"]) == ("beat", "tock")
    schedules = await listed(api)
    assert sorted(schedules) == ["beat", "nightly"]
    assert schedules["nightly"]["next"] == nightly["next"]
    # adding again replaces: a new version, new times
    again = await add_schedule(api, "nightly", type="report", cron="30 4 * * *", payload="x")
    assert again["version"] != nightly["version"] and again["tz"] == "UTC"
    assert all(when(t).hour == 4 and when(t).minute == 30 for t in again["next"])
    assert (await delete(api, "nightly")).json == {"deleted": "nightly"}
    assert_error(await delete(api, "nightly"), 404, "not_found")
    assert sorted(await listed(api)) == ["beat"]


async def test_bad_input_is_refused_with_the_error_shape(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    api = Api(session, daemons.start(tmp_path, pg_dsn, "--payload-limit", "100").url, "t", token)
    good: dict[str, Any] = {"type": "t", "cron": "0 * * * *", "payload": "p"}
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("bad*name", good, 400, "bad_name"),
        ("n" * 101, good, 400, "bad_name"),
        ("ok", {**good, "type": "bad type"}, 400, "bad_name"),
        ("ok", {**good, "type": 7}, 400, "bad_request"),
        ("ok", {**good, "cron": "61 * * * *"}, 400, "bad_request"),
        ("ok", {**good, "cron": "* * * *"}, 400, "bad_request"),
        ("ok", {**good, "cron": ["*"]}, 400, "bad_request"),
        ("ok", {**good, "tz": "Mars/Olympus"}, 400, "bad_request"),
        ("ok", {**good, "tz": "../../../etc/localtime"}, 400, "bad_request"),
        ("ok", {**good, "payload": "x" * 101}, 413, "too_large"),
        ("ok", {**good, "payload": ["x" * 100]}, 413, "too_large"),
        ("ok", {**good, "payload": "two\nlines"}, 400, "bad_payload"),
        ("ok", {**good, "payload": ""}, 400, "bad_payload"),
        ("ok", {"type": "t", "cron": "0 * * * *"}, 400, "bad_request"),
        ("ok", {**good, "every": 5}, 400, "bad_request"),
    ]
    for name, fields, status, kind in cases:
        reply = await put(api, name, fields)
        assert_error(reply, status, kind)
    for body in (b"not json", b"[1, 2]", b"", b'"s"'):
        reply = await api.request("POST", "/t/schedule/add/ok", data=body)
        assert_error(reply, 400, "bad_request")
    assert_error(await delete(api, "bad*name"), 400, "bad_name")
    assert_error(await delete(api, "none"), 404, "not_found")
    assert await listed(api) == {}
    # a tenant has at most 1000 schedules; replacing one still works at the limit
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with gate:
            assert (await put(api, f"s{i}", good)).status == 200

    await asyncio.gather(*(one(i) for i in range(1000)))
    assert_error(await put(api, "s1000", good), 400, "bad_request")
    assert (await put(api, "s7", {**good, "payload": "q"})).status == 200
    assert len(await listed(api)) == 1000


async def test_tenants_see_and_touch_only_their_own_schedules(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    tokens = {c: add_tenant(c, store=pg_dsn, data_dir=tmp_path, cwd=tmp_path) for c in "xy"}
    url = daemons.start(tmp_path, pg_dsn).url
    x, y = (Api(session, url, c, tokens[c]) for c in "xy")
    await add_schedule(x, "s", type="a", cron="0 * * * *", payload="x's")
    assert await listed(y) == {}
    assert_error(await delete(y, "s"), 404, "not_found")
    # y's token on x's paths
    y_on_x = x.as_("x", tokens["y"])
    assert_error(await put(y_on_x, "s", {"type": "a", "cron": "* * * * *", "payload": "p"}), 403)
    assert_error(await y_on_x.request("GET", "/x/schedules"), 403)
    assert_error(await delete(y_on_x, "s"), 403)
    assert_error(await x.as_("x", None).request("GET", "/x/schedules"), 401)
    await add_schedule(y, "s", type="b", cron=EVERY_SECOND, payload="y's")
    assert (await listed(x))["s"]["type"] == "a"
    # y's ticks are y's jobs
    beat = await ticked_past(y, "s", datetime.now(UTC), 30)
    job = await y.wait_job(beat["last_job"])
    assert (job["type"], job["payload"]) == ("b", "y's")
    assert (await x.get_job(beat["last_job"])).status == 404
    assert (await listed(x))["s"]["last_tick"] is None


async def test_a_tick_over_the_add_rate_is_added_later_not_lost(
    daemons: DaemonFactory, pg_dsn: str, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("t", store=pg_dsn, data_dir=tmp_path, cwd=tmp_path)
    # one job every 4 s, no more at once: most per-second ticks must wait
    daemon = daemons.start(tmp_path, pg_dsn, "--tenant-rate", "0.25", "--tenant-burst", "1")
    api = Api(session, daemon.url, "t", token)
    added = await add_schedule(api, "beat", type="beat", cron=EVERY_SECOND, payload="tock")
    first = when(added["next"][0])
    await ticked_past(api, "beat", first + timedelta(seconds=1), 30)  # the second job
    assert (await delete(api, "beat")).status == 200
    await api.wait_caught_up()
    ids = await stored_ids(pg_dsn, "t-beat")
    # the first tick at once; the next one (deferred, not skipped) when the rate allows
    assert tick_id("t", "beat", added["version"], ms(first)) in ids
    assert tick_id("t", "beat", added["version"], ms(first) + 1000) in ids
    assert len(ids) <= 3
    samples = await scrape(api.as_("*admin", admin_token(pg_dsn, tmp_path)))
    assert value(samples, "queue_schedule_ticks_deferred_total", tenant="t", reason="rate") > 0

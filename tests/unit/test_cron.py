"""When schedules fire: cron expressions in time zones (daylight saving time
included), and which tick a daemon adds after an outage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from queue_daemon.domain.schedules import DueSchedule
from queue_daemon.engine.admit.ids import tick_id
from queue_daemon.engine.schedule.cron import Cron, CronError
from queue_daemon.engine.schedule.ticker import plan_tick

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[arg-type,misc]


def local(zone: ZoneInfo, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=zone, fold=fold)  # type: ignore[arg-type,misc]


def test_next_ticks_are_strictly_after_and_in_utc() -> None:
    cron = Cron.parse("*/15 * * * *")
    assert cron.after(utc(2026, 1, 1, 12, 0), 3) == [
        utc(2026, 1, 1, 12, 15),
        utc(2026, 1, 1, 12, 30),
        utc(2026, 1, 1, 12, 45),
    ]
    assert cron.after(utc(2026, 1, 1, 12, 14, 59, 999999)) == [utc(2026, 1, 1, 12, 15)]
    assert all(t.tzinfo is UTC for t in cron.after(utc(2026, 1, 1), 2))


def test_a_seconds_field_first_fires_every_second() -> None:
    cron = Cron.parse("* * * * * *")
    start = utc(2026, 1, 1, 0, 0, 0) + timedelta(milliseconds=400)
    assert cron.after(start, 2) == [utc(2026, 1, 1, 0, 0, 1), utc(2026, 1, 1, 0, 0, 2)]
    assert cron.latest(start) == utc(2026, 1, 1, 0, 0, 0)


def test_latest_includes_an_exact_tick() -> None:
    cron = Cron.parse("0 * * * *")
    assert cron.latest(utc(2026, 1, 1, 5, 0)) == utc(2026, 1, 1, 5, 0)
    assert cron.latest(utc(2026, 1, 1, 5, 59, 59)) == utc(2026, 1, 1, 5, 0)


def test_the_time_zone_moves_the_ticks() -> None:
    cron = Cron.parse("0 9 * * *", "America/New_York")
    # 09:00 in New York is 14:00 UTC in winter, 13:00 in summer
    assert cron.after(utc(2026, 1, 10), 1) == [utc(2026, 1, 10, 14)]
    assert cron.after(utc(2026, 7, 10), 1) == [utc(2026, 7, 10, 13)]


def test_a_time_skipped_when_clocks_go_forward_fires_right_after_the_gap() -> None:
    # Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 never happens
    cron = Cron.parse("30 2 * * *", "Europe/Berlin")
    ticks = cron.after(local(BERLIN, 2026, 3, 28, 12), 3)
    assert [t.astimezone(BERLIN).replace(tzinfo=None) for t in ticks] == [
        datetime(2026, 3, 29, 3, 0),  # as Debian's cron: at once after the gap, once
        datetime(2026, 3, 30, 2, 30),
        datetime(2026, 3, 31, 2, 30),
    ]
    assert ticks[0] == utc(2026, 3, 29, 1, 0)


def test_a_time_repeated_when_clocks_go_back_fires_once() -> None:
    # Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice
    cron = Cron.parse("30 2 * * *", "Europe/Berlin")
    ticks = cron.after(local(BERLIN, 2026, 10, 24, 12), 2)
    assert ticks == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_hourly_ticks_across_both_transitions_are_an_hour_apart_in_real_time() -> None:
    cron = Cron.parse("0 * * * *", "America/New_York")
    # 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST
    for start in (utc(2026, 3, 8, 4), utc(2026, 11, 1, 3)):
        ticks = cron.after(start, 6)
        assert all(b - a == timedelta(hours=1) for a, b in pairwise(ticks))


def test_a_schedule_finer_than_an_hour_fires_through_the_repeated_hour_both_times() -> None:
    cron = Cron.parse("*/30 * * * *", "Europe/Berlin")
    ticks = cron.after(utc(2026, 10, 24, 23, 50), 6)  # 01:50 CEST
    # 02:00 and 02:30 CEST, then 02:00 and 02:30 CET again, then 03:00 and 03:30 CET
    assert ticks == [utc(2026, 10, 25, 0, 0) + timedelta(minutes=30 * i) for i in range(6)]


@pytest.mark.parametrize(
    ("expr", "tz", "says"),
    [
        ("* * * *", "UTC", "5 fields"),
        ("* * * * * * *", "UTC", "5 fields"),
        ("60 * * * *", "UTC", "Bad minute"),
        ("* 24 * * *", "UTC", "Bad hour"),
        ("hello", "UTC", "5 fields"),
        ("* * * * \x00", "UTC", "printable"),
        ("*" * 201, "UTC", "at most"),
        ("0 0 * * *", "Mars/Olympus", "not a known time zone"),
        ("0 0 * * *", "../../etc/passwd", "not an IANA"),
        ("0 0 * * *", "", "not an IANA"),
        ("0 0 * * *", "Europe/" + "x" * 80, "not an IANA"),
    ],
)
def test_bad_expressions_and_zones(expr: str, tz: str, says: str) -> None:
    with pytest.raises(CronError, match=says):
        Cron.parse(expr, tz)


def _due(next_fire: datetime, firing_at: datetime, now: datetime | None = None) -> DueSchedule:
    return DueSchedule(
        client="acme",
        name="every",
        type="t",
        cron="* * * * * *",
        tz="UTC",
        payload="p",
        version="v1",
        next_fire=next_fire,
        firing_at=firing_at,
        now=now or firing_at,
    )


def test_a_tick_on_time_is_not_a_catchup() -> None:
    t = utc(2026, 1, 1, 0, 0, 10)
    plan = plan_tick(_due(t, t + timedelta(milliseconds=3)))
    assert (plan.tick, plan.catchup, plan.next_fire) == (t, False, t + timedelta(seconds=1))
    assert plan.job == tick_id("acme", "every", "v1", int(t.timestamp() * 1000))


def test_after_an_outage_the_latest_missed_tick_is_added_once() -> None:
    missed = utc(2026, 1, 1, 0, 0, 10)
    back = missed + timedelta(seconds=30, milliseconds=500)
    plan = plan_tick(_due(missed, back))
    assert plan.catchup and plan.tick == utc(2026, 1, 1, 0, 0, 40)
    assert plan.next_fire == utc(2026, 1, 1, 0, 0, 41)


def test_a_daemon_taking_over_adds_the_same_tick_and_skips_to_after_now() -> None:
    fire = utc(2026, 1, 1, 0, 0, 10)
    first = plan_tick(_due(fire, fire))
    later = plan_tick(_due(fire, fire, now=fire + timedelta(seconds=12, milliseconds=1)))
    assert later.job == first.job and later.tick == first.tick
    assert later.next_fire == utc(2026, 1, 1, 0, 0, 23)


def test_tick_ids_differ_by_tenant_schedule_version_and_tick() -> None:
    ids = {
        tick_id("a", "s", "v1", 1000),
        tick_id("b", "s", "v1", 1000),
        tick_id("a", "t", "v1", 1000),
        tick_id("a", "s", "v2", 1000),
        tick_id("a", "s", "v1", 2000),
    }
    assert len(ids) == 5
    assert all(i.startswith("s") and i.isalnum() for i in ids)
    assert tick_id("a", "s", "v1", 1000) == tick_id("a", "s", "v1", 1000)


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize("expr", ["30 2 * * *", "15 1-3 * * *", "*/30 * * * *", "0 * * * *"])
def test_the_latest_tick_agrees_with_the_next_ticks_across_dst_changes(expr: str, tz: str) -> None:
    # the tick a catch-up adds: at or before the moment, and no tick between them
    # (going back through a repeated hour, cronsim alone skipped the first pass's)
    cron = Cron.parse(expr, tz)
    # the spring and autumn changes of the three zones' 2026
    days = [(3, 7), (3, 28), (4, 4), (10, 3), (10, 24), (10, 31)]
    for start in (utc(2026, month, day, 10) for month, day in days):
        moment = start
        while moment < start + timedelta(hours=24):
            latest = cron.latest(moment)
            assert latest is not None and latest <= moment
            assert cron.after(latest)[0] > moment, (moment, latest)
            moment += timedelta(minutes=7, seconds=13)

"""Cron expressions in a time zone: when a schedule fires.

Parsing and stepping are cronsim's (Debian cron's semantics, daylight saving
time included: a time skipped when clocks go forward fires at the first minute
after the gap; a time repeated when they go back fires once) on ``zoneinfo``
zones. An expression has five fields (minute hour day-of-month month
day-of-week), or six with a seconds field first (``*/10 * * * * *``). Every
time given or returned here is an aware datetime; results are in UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

MAX_CRON = 200  # characters of an expression
# IANA names: "UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT+5"
_TZ_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,3}")
_MAX_TZ = 64
_CATCH_UP_STEPS = 100  # forward steps that check a tick found going back


class CronError(ValueError):
    """An expression or time zone that cannot be used; the message says why."""


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; CronError when there is none."""
    if len(name) > _MAX_TZ or not _TZ_NAME.fullmatch(name):
        raise CronError(f"tz {name[:_MAX_TZ]!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"tz {name!r} is not a known time zone") from None


@dataclass(frozen=True, slots=True)
class Cron:
    """A valid expression in a time zone; ``parse`` checks it."""

    expr: str
    zone: ZoneInfo

    @classmethod
    def parse(cls, expr: str, tz: str = "UTC", now: datetime | None = None) -> Cron:
        """CronError for a bad expression or zone, or one that never fires."""
        if len(expr) > MAX_CRON or not expr.isascii() or not expr.isprintable():
            raise CronError(f"cron must be at most {MAX_CRON} printable ASCII characters")
        fields = expr.split()
        if len(fields) not in (5, 6):
            raise CronError(
                "cron must have 5 fields (minute hour day-of-month month day-of-week),"
                " or 6 with seconds first"
            )
        cron = cls(" ".join(fields), zone(tz))
        try:
            cron.after(now or datetime.now(UTC))
        except CronSimError as exc:
            raise CronError(f"cron {expr!r}: {exc}") from None
        except StopIteration:
            raise CronError(f"cron {expr!r} never fires") from None
        return cron

    def after(self, when: datetime, n: int = 1) -> list[datetime]:
        """The first ``n`` ticks strictly after ``when``. StopIteration when there
        are none within about 50 years (cronsim's horizon)."""
        ticks = CronSim(self.expr, when.astimezone(self.zone))
        return [next(ticks).astimezone(UTC) for _ in range(n)]

    def latest(self, upto: datetime) -> datetime | None:
        """The last tick at or before ``upto``; None when there is none in 50 years."""
        # cronsim going back starts at ``upto`` itself only when it has microseconds
        start = upto if upto.microsecond else upto + timedelta(microseconds=1)
        try:
            tick = next(CronSim(self.expr, start.astimezone(self.zone), reverse=True))
        except StopIteration:
            return None
        latest = tick.astimezone(UTC)
        # Going back through an hour repeated by a DST change, cronsim can step
        # over a tick of the first pass: the forward steps are the reference, and
        # a few of them from there find any tick it missed.
        for _ in range(_CATCH_UP_STEPS):
            try:
                [following] = self.after(latest)
            except StopIteration:
                break
            if following > upto:
                break
            latest = following
        return latest

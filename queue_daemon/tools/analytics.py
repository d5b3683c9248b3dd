"""Analytics over queue logfiles (``queue-daemon stats``): per tenant and type,
jobs added, done by code, retries, queue wait and run time percentiles,
throughput per minute.

Reading streams: files (plain or gzip, told apart by their magic bytes, in
the order of their first line's time) are read line by line, and what is kept
does not grow with the number of lines: counters per (tenant, type),
percentile sketches (``Quantiles``) and per-minute counts for the timeline.
A line that is not a queue log record (a torn last line, garbage) is counted
as bad, never raised.
"""

from __future__ import annotations

import gzip
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from queue_daemon.observe.records import Ev, read_head
from queue_daemon.tools.quantiles import PERCENTILE_METHOD, PERCENTILES, Quantiles
from queue_daemon.tools.readlog import LogFile, file_size, in_time_order

MINUTE_MS = 60_000
_NEVER_LO = 1 << 62  # first_ms before any line
_NEVER_HI = -(1 << 62)
CODES = ("ok", "failed", "error", "retry")
# the record kinds as plain strings: compared once per line in the inner loop
_ADDED, _STARTED, _FINISHED, _RETRY = (
    Ev.ADDED.value,
    Ev.STARTED.value,
    Ev.FINISHED.value,
    Ev.RETRY.value,
)
_CANCELLED, _EXPIRED, _PURGED = Ev.CANCELLED.value, Ev.EXPIRED.value, Ev.PURGED.value
_LOST_LEASE = Ev.LOST_LEASE.value


@dataclass(slots=True)
class Group:
    """What happened to the jobs of one tenant's type."""

    lines: int = 0
    added: int = 0
    started: int = 0
    done: Counter[str] = field(default_factory=Counter)  # finished for good, by code
    retries: int = 0
    put_back: int = 0  # runs ended without counting (shutdown, context died first)
    cancelled: int = 0
    expired: int = 0  # locks that ran out
    lost_lease: int = 0  # runs ended after their daemon lost the lease (outcome refused)
    purged: int = 0
    wait: Quantiles = field(default_factory=Quantiles)
    run: Quantiles = field(default_factory=Quantiles)


@dataclass(slots=True)
class Analysis:
    """Aggregates records; ``since``/``until`` in epoch ms (until exclusive)."""

    since: int | None = None
    until: int | None = None
    tenants: frozenset[str] | None = None
    lines: int = 0
    bad: int = 0
    matched: int = 0
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    added_per_minute: Counter[int] = field(default_factory=Counter)
    done_per_minute: Counter[int] = field(default_factory=Counter)
    _lo: int = 0
    _hi: int = 0
    _first: int = _NEVER_LO
    _last: int = _NEVER_HI
    _key: tuple[str, str] = ("", "")  # the group of the previous line (lines come in runs)
    _group: Group = field(default_factory=Group)

    def __post_init__(self) -> None:
        self._lo = -(1 << 62) if self.since is None else self.since
        self._hi = 1 << 62 if self.until is None else self.until

    def feed(self, raw: bytes) -> None:
        """One line of a logfile (the inner loop of ``stats``: kept flat)."""
        self.lines += 1
        parsed = read_head(raw)
        if parsed is None:
            self.bad += 1
            return
        ev, t, tenant, name, record = parsed
        if not self._lo <= t < self._hi:
            return
        if self.tenants is not None and tenant not in self.tenants:
            return
        if tenant == self._key[0] and name == self._key[1]:
            group = self._group
        else:
            key = (tenant, name)
            group = self.groups.get(key)  # type: ignore[assignment]
            if group is None:
                group = self.groups[key] = Group()
            self._key, self._group = key, group
        try:
            self._count(group, ev, t, record)
        except (TypeError, ValueError):
            self.bad += 1
            return
        group.lines += 1
        self.matched += 1
        if t < self._first:
            self._first = t
        if t > self._last:
            self._last = t

    def _count(self, group: Group, ev: str, t: int, record: dict[str, Any]) -> None:
        if ev == _ADDED:
            group.added += 1
            self.added_per_minute[t // MINUTE_MS] += 1
        elif ev == _STARTED:
            wait = record.get("wait_ms")
            if wait is not None:
                group.wait.add(_number(wait))
            group.started += 1
        elif ev == _FINISHED:
            ran = record.get("run_ms")
            if ran is not None:
                group.run.add(_number(ran))
            how = record.get("how")
            if how == "archive":
                group.done[str(record.get("code"))] += 1
                self.done_per_minute[t // MINUTE_MS] += 1
            elif how == "unget":
                group.put_back += 1
        elif ev == _RETRY:
            group.retries += 1
        elif ev == _CANCELLED:
            group.cancelled += 1
            self.done_per_minute[t // MINUTE_MS] += 1
        elif ev == _EXPIRED:
            group.expired += 1
        elif ev == _LOST_LEASE:
            group.lost_lease += 1
        elif ev == _PURGED:
            group.purged += int(record.get("n", 0))

    @property
    def first_ms(self) -> int | None:
        return None if self._first == _NEVER_LO else self._first

    @property
    def last_ms(self) -> int | None:
        return None if self._last == _NEVER_HI else self._last

    @property
    def span_minutes(self) -> float:
        """Minutes the matched lines cover (at least one)."""
        if self.first_ms is None or self.last_ms is None:
            return 1.0
        return max(1.0, (self.last_ms - self.first_ms) / MINUTE_MS)

    def report(self, files: Sequence[str] = ()) -> dict[str, Any]:
        """The JSON document of ``stats --json`` (and what the table and HTML show)."""
        span = self.span_minutes
        groups = []
        for (tenant, name), g in sorted(self.groups.items()):
            if not g.lines:
                continue  # only bad lines named it
            done = {code: g.done.get(code, 0) for code in CODES}
            done.update({code: n for code, n in g.done.items() if code not in done})
            finished = sum(done.values()) + g.cancelled
            groups.append(
                {
                    "tenant": tenant,
                    "type": name,
                    "added": g.added,
                    "started": g.started,
                    "done": done,
                    "cancelled": g.cancelled,
                    "retries": g.retries,
                    "put_back": g.put_back,
                    "expired": g.expired,
                    "lost_lease": g.lost_lease,
                    "purged": g.purged,
                    "wait_ms": g.wait.summary(),
                    "run_ms": g.run.summary(),
                    "throughput_per_min": round(finished / span, 3),
                }
            )
        return {
            "files": list(files),
            "lines": self.lines,
            "bad_lines": self.bad,
            "matched": self.matched,
            "since": self.since,
            "until": self.until,
            "tenants": None if self.tenants is None else sorted(self.tenants),
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
            "span_minutes": round(span, 3),
            "percentiles": PERCENTILE_METHOD,
            "groups": groups,
            "timeline": {
                "bucket_ms": MINUTE_MS,
                "points": [
                    {
                        "t": minute * MINUTE_MS,
                        "added": self.added_per_minute.get(minute, 0),
                        "done": self.done_per_minute.get(minute, 0),
                    }
                    for minute in sorted(set(self.added_per_minute) | set(self.done_per_minute))
                ],
            },
        }


def _number(value: object) -> float:
    if type(value) is int or type(value) is float:
        return value
    raise TypeError(f"not a number: {value!r}")


# --- reading ------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal's stderr; silent otherwise."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.total = max(total, 1)
        self._last = 0.0
        self._began = time.monotonic()

    def show(self, done: int, lines: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        share = min(1.0, done / self.total)
        width = 30
        bar = "#" * int(share * width)
        rate = lines / max(now - self._began, 1e-6)
        self.stream.write(f"\r[{bar:<{width}}] {share:6.1%} {lines:,} lines {rate:,.0f}/s")
        self.stream.flush()

    def end(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 70 + "\r")
            self.stream.flush()


def analyze(
    paths: Sequence[Path],
    analysis: Analysis,
    *,
    progress: Progress | None = None,
    on_error: Callable[[Path, Exception], None] | None = None,
) -> Analysis:
    """Feed every line of ``paths`` (in time order) to ``analysis``.

    A file that cannot be read (or a gzip stream cut short) ends that file's
    lines; ``on_error`` hears of it and the rest is still read."""
    ordered = in_time_order(paths)
    base = 0
    feed = analysis.feed
    for path in ordered:
        try:
            with LogFile(path) as log:
                for count, raw in enumerate(log.lines, 1):
                    feed(raw)
                    if progress is not None and not count & 0xFFFF:
                        progress.show(base + log.position, analysis.lines)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            analysis.bad += 1
            if on_error is not None:
                on_error(path, exc)
        base += file_size(path)
    if progress is not None:
        progress.end()
    return analysis


def parse_time(value: str) -> int:
    """Epoch ms from ISO-8601 (naive = UTC) or a number of epoch milliseconds."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


# --- text output ---------------------------------------------------------------


def _num(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)}"
    return f"{value:.3g}" if value < 10 else f"{value:.0f}"


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table, one row per tenant and type, and a summary line."""
    header = [
        "tenant",
        "type",
        "added",
        "ok",
        "failed",
        "error",
        "retry",
        "cancel",
        "retries",
        "wait p50/p95/p99 ms",
        "run p50/p95/p99 ms",
        "done/min",
    ]
    rows = [header]
    for g in report["groups"]:
        done = g["done"]
        wait, run = g["wait_ms"], g["run_ms"]
        rows.append(
            [
                g["tenant"],
                g["type"],
                str(g["added"]),
                str(done.get("ok", 0)),
                str(done.get("failed", 0)),
                str(done.get("error", 0)),
                str(done.get("retry", 0)),
                str(g["cancelled"]),
                str(g["retries"]),
                "/".join(_num(wait[f"p{p}"]) for p in PERCENTILES),
                "/".join(_num(run[f"p{p}"]) for p in PERCENTILES),
                _num(g["throughput_per_min"]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    text = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    span = ""
    if report["first_ms"] is not None:
        span = f" from {_iso(report['first_ms'])} to {_iso(report['last_ms'])}"
    text.append(
        f"{report['matched']} of {report['lines']} lines{span}; "
        f"{report['bad_lines']} bad lines; percentiles {report['percentiles']}"
    )
    return "\n".join(text) + "\n"


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )

"""The queue logfile: one JSON line per job event, written in the background,
rotated by size and by day between whole lines, nothing lost on close."""

from __future__ import annotations

import asyncio
import gzip
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from queue_daemon.cli import CliError, build_parser, settings_from
from queue_daemon.domain.jobs import ClaimedJob, ExpiredLock, Release, ReleaseHow, epoch_ms
from queue_daemon.observe.logfile import Rotation
from queue_daemon.observe.queuelog import QueueLog, payload_size

T0 = 1_700_000_000_000


def read(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return [orjson.loads(line) for line in f.read().splitlines()]


def listing(folder: Path, pattern: str = "*") -> list[Path]:
    return sorted(folder.glob(pattern))


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


async def test_every_kind_of_line_with_its_fields(tmp_path: Path) -> None:
    path = tmp_path / "queue-s1.log"
    log = QueueLog(path, sysid="s1")
    log.added("acme-resize", ["1-1", "2-1"], ["{}", "héllo"], T0, T0 + 5000)
    log.started(
        "acme-resize",
        [
            ClaimedJob(
                id="1-1", type="acme-resize", data="{}", attempts=1, created_ms=epoch_ms(at(T0))
            ),
            ClaimedJob(
                id="2-1",
                type="acme-resize",
                data="x",
                attempts=2,
                created_ms=epoch_ms(at(T0)),
                due_ms=T0 + 5000,
            ),
        ],
        at_ms=T0 + 7000,
    )
    log.finished(
        "acme-resize",
        [
            Release(id="1-1", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200),
            Release(id="2-1", how=ReleaseHow.RETRY, code="error", exitcode=500, delay=1.5),
        ],
        attempts={"1-1": 1, "2-1": 2},
        run_ms={"1-1": 12.3456, "2-1": 0.5},
    )
    log.finished("acme-resize", [Release(id="3-1", how=ReleaseHow.UNGET, refund_attempt=True)])
    log.expired([ExpiredLock("4-1", "acme-re-size", 3)])
    log.cancelled("acme-resize", "5-1")
    log.purged({"acme-resize": 7, "beta-x": 2})
    log.log("acme-resize", "1-1", ['said "hi"', "\x00 and | and #:"])
    await log.close()

    records = read(path)
    for r in records:
        assert r["tenant"] in ("acme", "beta") and isinstance(r["t"], int)
    by = {(r["ev"], r.get("id")): r for r in records}
    assert records[0] == {
        "ev": "added",
        "t": T0,
        "tenant": "acme",
        "type": "resize",
        "id": "1-1",
        "size": 2,
        "sysid": "s1",
        "dt": T0 + 5000,
    }
    assert by["added", "2-1"]["size"] == len("héllo".encode())
    assert by["started", "1-1"]["wait_ms"] == 7000  # from its creation
    assert by["started", "2-1"] == {
        "ev": "started",
        "t": T0 + 7000,
        "tenant": "acme",
        "type": "resize",
        "id": "2-1",
        "attempt": 2,
        "sysid": "s1",
        "wait_ms": 2000,  # from when it was due
    }
    ok = by["finished", "1-1"]
    assert (ok["code"], ok["exitcode"], ok["run_ms"], ok["how"], ok["attempt"]) == (
        "ok",
        200,
        12.346,
        "archive",
        1,
    )
    retry = by["retry", "2-1"]
    assert (retry["code"], retry["exitcode"], retry["attempt"], retry["delay_ms"]) == (
        "error",
        500,
        2,
        1500,
    )
    assert retry["dt"] == retry["t"] + 1500
    assert by["finished", "2-1"]["how"] == "retry"
    back = by["finished", "3-1"]
    assert (back["how"], back["code"], back["exitcode"], back["run_ms"]) == (
        "unget",
        None,
        None,
        None,
    )
    # split at the first "-" only: type names may hold more
    assert (by["expired", "4-1"]["type"], by["expired", "4-1"]["attempt"]) == ("re-size", 3)
    assert by["cancelled", "5-1"]["sysid"] == "s1"
    purged = [(r["tenant"], r["type"], r["n"]) for r in records if r["ev"] == "purged"]
    assert purged == [("acme", "resize", 7), ("beta", "x", 2)]
    assert records[-1]["lines"] == ['said "hi"', "\x00 and | and #:"]
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_payload_size_is_utf8_bytes() -> None:
    assert payload_size("abc") == 3
    assert payload_size("é€") == 5


async def test_rotation_by_size_keeps_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "queue-s1.log"
    log = QueueLog(path, sysid="s1", rotation=Rotation(logfile_max_bytes=1000, logfile_daily=False))
    ids = [f"{i}-1" for i in range(200)]
    for start in range(0, 200, 30):  # several flushes of several lines
        chunk = ids[start : start + 30]
        log.added("a-t", chunk, ["x" * (i % 7) for i in range(len(chunk))], T0, T0)
        await log.flush()
    await log.close()
    files = listing(tmp_path, "queue-s1.log*")
    assert len(files) > 5
    seen = []
    for f in files:
        data = f.read_bytes()
        assert data.endswith(b"\n")
        assert len(data) <= 1000
        seen += [r["id"] for r in read(f)]
    assert sorted(seen) == sorted(ids)
    assert all(f.name.startswith("queue-s1.log.") for f in files if f != path)


async def test_rotation_by_day_and_gzip(tmp_path: Path) -> None:
    path = tmp_path / "queue-s1.log"
    path.write_bytes(b'{"ev":"added","t":1,"tenant":"a","type":"t","id":"old"}\n')
    yesterday = (datetime.now(UTC) - timedelta(days=1)).timestamp()
    os.utime(path, (yesterday, yesterday))
    log = QueueLog(path, sysid="s1", rotation=Rotation(logfile_daily=True, logfile_gzip=True))
    log.added("a-t", ["new"], ["p"], T0, T0)
    await log.close()  # waits for the compression too
    rotated = [f for f in listing(tmp_path) if f != path]
    assert len(rotated) == 1 and rotated[0].name.endswith(".gz")
    assert [r["id"] for r in read(rotated[0])] == ["old"]
    assert [r["id"] for r in read(path)] == ["new"]


async def test_rotated_files_left_uncompressed_are_compressed_at_start(tmp_path: Path) -> None:
    path = tmp_path / "queue-s1.log"
    left = tmp_path / "queue-s1.log.20261121T000000Z"
    left.write_bytes(b'{"ev":"added","t":1,"tenant":"a","type":"t","id":"left"}\n')
    (tmp_path / ".queue-s1.log.20261121T000000Z.gz.partial").write_bytes(b"\x1f\x8b")
    log = QueueLog(path, rotation=Rotation(logfile_gzip=True))
    log.compress_leftovers()
    await log.close()
    names = [f.name for f in listing(tmp_path, "queue-s1.log*")]
    assert names == ["queue-s1.log", "queue-s1.log.20261121T000000Z.gz"]
    assert [r["id"] for r in read(tmp_path / names[1])] == ["left"]
    assert not listing(tmp_path, ".*")  # the stale partial copy was overwritten and renamed


async def test_a_line_over_the_size_limit_goes_in_whole(tmp_path: Path) -> None:
    path = tmp_path / "q.log"
    log = QueueLog(path, rotation=Rotation(logfile_max_bytes=50, logfile_daily=False))
    log.log("a-t", "1-1", ["x" * 200])
    log.log("a-t", "2-1", ["y"])
    await log.close()
    lines = [r["id"] for f in listing(tmp_path) for r in read(f)]
    assert sorted(lines) == ["1-1", "2-1"]


async def test_close_writes_what_is_buffered_even_after_a_cancelled_flush(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.log"
    log = QueueLog(path)
    log.added("a-t", [f"{i}-1" for i in range(5000)], ["p"] * 5000, T0, T0)
    task = asyncio.ensure_future(log.flush())
    await asyncio.sleep(0)
    task.cancel()
    log.cancelled("a-t", "last")
    await log.close()
    records = read(path)
    assert len(records) == 5001 and records[-1]["ev"] == "cancelled"


@pytest.mark.parametrize("n", [1, 1000])
async def test_added_lines_are_valid_json(tmp_path: Path, n: int) -> None:
    path = tmp_path / "q.log"
    log = QueueLog(path, sysid="s9")
    log.added("a-t.x:y", [f"{i:x}-9" for i in range(n)], ['{"a":"\\n"}'] * n, T0, T0)
    await log.close()
    assert [r["type"] for r in read(path)] == ["t.x:y"] * n


def test_rotation_flags_and_their_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve"])
    settings = settings_from(args)
    assert (settings.logfile_max_bytes, settings.logfile_daily, settings.logfile_gzip) == (
        256 << 20,
        True,
        False,
    )
    flags = ["serve", "--logfile-max-bytes", "1000", "--logfile-daily", "off", "--logfile-gzip"]
    settings = settings_from(build_parser().parse_args(flags))
    assert (settings.logfile_max_bytes, settings.logfile_daily, settings.logfile_gzip) == (
        1000,
        False,
        True,
    )
    monkeypatch.setenv("QUEUE_DAEMON_LOGFILE_GZIP", "1")
    monkeypatch.setenv("QUEUE_DAEMON_LOGFILE_DAILY", "off")
    monkeypatch.setenv("QUEUE_DAEMON_LOGFILE_MAX_BYTES", "0")
    settings = settings_from(build_parser().parse_args(["serve"]))
    assert (settings.logfile_max_bytes, settings.logfile_daily, settings.logfile_gzip) == (
        0,
        False,
        True,
    )
    with pytest.raises(CliError, match="--logfile-daily"):
        settings_from(build_parser().parse_args(["serve", "--logfile-daily", "weekly"]))
    with pytest.raises(CliError, match="--logfile-max-bytes"):
        settings_from(build_parser().parse_args(["serve", "--logfile-max-bytes", "-1"]))

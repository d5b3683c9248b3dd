"""The journal on real files: durability, group commit, recovery, reservations, check."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from queue_daemon.journal import Entry, Journal, JournalError, JournalUnavailable, check
from queue_daemon.journal.format import Frame, scan, segment_name
from queue_daemon.journal.journal import INLINE_MAX_BYTES, INLINE_QUIET_S

REPO = Path(__file__).resolve().parents[2]
NASTY = [
    "plain",
    "a|b|c|d",
    "#:Batch seq=1,date=2024-01-01T00:00:00.000Z,lines=1,bytes=5,crc=00000000",
    "#:EndBatch",
    "cr\r\rlf-less",
    "unicode é ✓ 🚀 \u2028 end",
    "",
]


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    j = await Journal.open(tmp_path / "j")
    yield j
    await j.close()


async def write_batch(j: Journal, name: str, n: int = 1, type: str = "acme-mail") -> list[Entry]:
    ids = [f"{name}-{i}" for i in range(n)]
    payloads = [f"payload of {name}-{i}" for i in range(n)]
    await j.write(type, ids, payloads, create_ms=1000, dt_ms=2000)
    return [Entry(i, 1000, 2000, type, p) for i, p in zip(ids, payloads, strict=True)]


async def drain(j: Journal, *, sync: bool = True) -> list[Entry]:
    """Everything readable now, reserved in small steps."""
    out: list[Entry] = []
    while (r := j.read_reserve(3, 60)) is not None:
        out.extend(await j.read(r))
        if sync:
            await j.rsync(r)
    return out


def segment_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("seg-*.log"))


def batch_offsets(seg: Path) -> list[tuple[int, int]]:
    return [(f.offset, f.end) for f in scan(seg.read_bytes()) if isinstance(f, Frame)]


# ---- round trip ----------------------------------------------------------------------------


async def test_round_trip_nasty_payloads(journal: Journal) -> None:
    ids = [f"id{i}" for i in range(len(NASTY))]
    await journal.write("acme-mail", ids, NASTY, create_ms=111, dt_ms=222)
    r = journal.read_reserve(100, 60)
    assert r is not None
    assert r.lines == len(NASTY)
    assert await journal.read(r) == [
        Entry(i, 111, 222, "acme-mail", p) for i, p in zip(ids, NASTY, strict=True)
    ]
    await journal.rsync(r)
    assert journal.read_reserve(100, 60) is None


async def test_round_trip_from_files(tmp_path: Path) -> None:
    ids = [f"id{i}" for i in range(len(NASTY))]
    async with await Journal.open(tmp_path / "j", cache_bytes=0) as j:
        await j.write("acme-mail", ids, NASTY, create_ms=1, dt_ms=2)
        from_file = await drain(j, sync=False)
    async with await Journal.open(tmp_path / "j") as j:
        after_restart = await drain(j)
    expected = [Entry(i, 1, 2, "acme-mail", p) for i, p in zip(ids, NASTY, strict=True)]
    assert from_file == after_restart == expected


async def test_rejects_bad_input_and_writes_nothing(journal: Journal) -> None:
    with pytest.raises(ValueError):
        await journal.write("acme-mail", ["a", "b"], ["ok", "new\nline"], create_ms=1, dt_ms=1)
    with pytest.raises(ValueError):
        await journal.write("acme-mail", ["a|b"], ["ok"], create_ms=1, dt_ms=1)
    with pytest.raises(ValueError):
        await journal.write("acme-mail", [], [], create_ms=1, dt_ms=1)
    assert journal.fsync_count == 0
    assert journal.read_reserve(10, 60) is None


# ---- group commit and durability -------------------------------------------------------------


async def test_concurrent_writers_share_fsyncs(journal: Journal) -> None:
    expected = await asyncio.gather(*(write_batch(journal, f"w{i}") for i in range(200)))
    assert journal.fsync_count < 200
    got = await drain(journal)
    assert sorted(e.id for e in got) == sorted(e.id for batch in expected for e in batch)


async def test_durable_before_visible_and_batched_while_flushing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = await Journal.open(tmp_path / "j", inline=False)  # every write on the thread
    real_fdatasync = os.fdatasync
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    release = threading.Event()
    threads: list[str] = []

    def slow_fdatasync(fd: int) -> None:
        threads.append(threading.current_thread().name)
        loop.call_soon_threadsafe(started.set)
        release.wait(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    first = asyncio.create_task(write_batch(journal, "first"))
    await started.wait()  # the flush of "first" is under way
    later = [asyncio.create_task(write_batch(journal, f"later{i}")) for i in range(10)]
    await asyncio.sleep(0)  # let the later writers queue their batches
    assert not first.done()
    assert journal.read_reserve(100, 60) is None  # not durable, so not visible
    assert not await journal.wait_readable(0)
    release.set()
    await asyncio.gather(first, *later)
    assert journal.fsync_count == 2  # "first", then the 10 later ones together
    assert all(name.startswith("journal-write") for name in threads)
    assert len(await drain(journal)) == 11
    await journal.close()


def _fsync_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that fdatasync from now on."""
    real_fdatasync = os.fdatasync
    threads: list[str] = []

    def recording_fdatasync(fd: int) -> None:
        threads.append(threading.current_thread().name)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    return threads


async def test_a_quiet_write_is_made_on_the_loop(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _fsync_threads(monkeypatch)
    await write_batch(journal, "quiet")
    assert threads == [threading.current_thread().name]
    assert [e.id for e in await drain(journal)] == ["quiet-0"]


async def test_writes_close_together_go_to_the_thread_and_share_fsyncs(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _fsync_threads(monkeypatch)
    await asyncio.gather(*(write_batch(journal, f"w{i}") for i in range(50)))
    # the first is made on the loop, alone; the others waited for it, then went
    # to the thread together
    assert threads[0] == threading.current_thread().name
    assert 2 <= len(threads) < 50
    assert all(name.startswith("journal-write") for name in threads[1:])
    assert len(await drain(journal)) == 50


async def test_a_slow_disk_keeps_writes_off_the_loop(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        time.sleep(0.01)  # a slow disk, not a synchronisation
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    for i in range(3):  # the average of the writes' time passes the limit
        await write_batch(journal, f"slow{i}")
        await asyncio.sleep(INLINE_QUIET_S)
    threads = _fsync_threads(monkeypatch)
    await write_batch(journal, "after")
    assert len(threads) == 1 and threads[0].startswith("journal-write")


async def test_a_big_batch_is_written_by_the_thread(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _fsync_threads(monkeypatch)
    await journal.write("acme-big", ["big-0"], ["x" * (INLINE_MAX_BYTES + 1)], create_ms=1, dt_ms=1)
    assert len(threads) == 1 and threads[0].startswith("journal-write")
    assert [e.id for e in await drain(journal)] == ["big-0"]


async def test_a_new_segment_is_made_by_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Journal.open(tmp_path / "j", segment_bytes=1000) as j:
        threads = _fsync_threads(monkeypatch)
        await j.write("acme-mail", ["fill-0"], ["x" * 2000], create_ms=1, dt_ms=1)
        await asyncio.sleep(INLINE_QUIET_S)
        await write_batch(j, "next")  # the segment is full: this one starts another
        assert threads[0] == threading.current_thread().name  # the first, on the loop
        assert len(threads) == 2 and threads[1].startswith("journal-write")
        assert len(segment_files(tmp_path / "j")) == 2
        assert [e.id for e in await drain(j)] == ["fill-0", "next-0"]


async def test_a_writer_cancelled_at_its_turn_on_the_loop_is_written(tmp_path: Path) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        write = asyncio.create_task(write_batch(j, "cancelled"))
        await asyncio.sleep(0)  # it holds the loop's turn, handed over and not yet written
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        assert await j.wait_readable(10)  # the thread wrote it
        assert [e.id for e in await drain(j)] == ["cancelled-0"]


async def test_close_waits_for_a_write_on_the_loop(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j")
    write = asyncio.create_task(write_batch(j, "last"))
    closing = asyncio.create_task(j.close())  # begins while the write waits for its turn
    await asyncio.gather(write, closing)
    async with await Journal.open(tmp_path / "j") as j2:
        assert [e.id for e in await drain(j2)] == ["last-0"]


async def test_close_waits_for_in_flight_writes(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j")
    writes = [write_batch(j, f"w{i}") for i in range(50)]
    await asyncio.gather(*writes, j.close())
    with pytest.raises(JournalUnavailable):
        await write_batch(j, "late")
    async with await Journal.open(tmp_path / "j") as j2:
        assert len(await drain(j2)) == 50


async def test_failed_fsync_refuses_further_writes(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await write_batch(journal, "before")
    assert journal.writable

    def failing_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(JournalUnavailable):
        await write_batch(journal, "failed")
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    with pytest.raises(JournalUnavailable):
        await write_batch(journal, "after")
    assert not journal.writable
    assert any(getattr(r, "action", None) == "journal_broken" for r in caplog.records)
    assert [e.id for e in await drain(journal)] == ["before-0"]


async def test_disk_full_is_transient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        await write_batch(j, "a")
        real_pwrite = os.pwrite

        def half_then_full(fd: int, data: Any, offset: int) -> int:
            if len(data) > 10:
                return real_pwrite(fd, bytes(data[:10]), offset)  # a partial write first
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", half_then_full)
        with pytest.raises(JournalUnavailable):
            await write_batch(j, "b")
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        await write_batch(j, "c")
        assert [e.id for e in await drain(j, sync=False)] == ["a-0", "c-0"]
    assert check(path).ok
    async with await Journal.open(path) as j:
        assert [e.id for e in await drain(j)] == ["a-0", "c-0"]


# ---- recovery ------------------------------------------------------------------------------


async def test_torn_tail_at_every_byte(tmp_path: Path) -> None:
    src = tmp_path / "src"
    async with await Journal.open(src) as j:
        expected = await write_batch(j, "one", 3)
        expected += await write_batch(j, "two", 2)
        await write_batch(j, "torn", 1)
    seg = src / segment_name(1)
    start, end = batch_offsets(seg)[-1]
    for cut in range(start, end):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(src, work)
        os.truncate(work / segment_name(1), cut)
        async with await Journal.open(work) as j:
            assert await drain(j, sync=False) == expected, cut
            assert (work / segment_name(1)).stat().st_size == start  # torn bytes cut off
            new = await write_batch(j, "new")
            assert await drain(j) == new
        assert check(work).ok
        shutil.rmtree(work)


@pytest.mark.parametrize("where", ["header", "body", "trailer"])
async def test_corrupt_middle_batch_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        one = await write_batch(j, "one", 2)
        await write_batch(j, "two", 2)
        three = await write_batch(j, "three", 2)
    seg = path / segment_name(1)
    data = bytearray(seg.read_bytes())
    start, end = batch_offsets(seg)[1]
    pos = {"header": start + 3, "body": start + (end - start) // 2, "trailer": end - 3}[where]
    data[pos] ^= 0x04
    seg.write_bytes(data)

    report = check(path)
    assert not report.ok
    assert [(p.kind, p.offset) for p in report.problems] == [("corrupt", start)]

    with caplog.at_level(logging.ERROR, logger="queue_daemon.journal"):
        async with await Journal.open(path) as j:
            assert await drain(j) == one + three
            assert await write_batch(j, "four") == await drain(j)
    bad = path / f"corrupt-{1:016d}-{start}.bad"
    assert bad.read_bytes() == bytes(data[start:end])
    records = [r for r in caplog.records if getattr(r, "action", None) == "journal_corrupt"]
    assert len(records) == 1
    assert records[0].levelno == logging.ERROR
    assert records[0].__dict__["offset"] == start


async def test_corrupt_last_batch_is_a_torn_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        one = await write_batch(j, "one", 2)
        two = await write_batch(j, "two", 2)
        await write_batch(j, "three", 2)
    seg = path / segment_name(1)
    data = bytearray(seg.read_bytes())
    start, end = batch_offsets(seg)[2]
    data[start + (end - start) // 2] ^= 0x04
    seg.write_bytes(data)

    report = check(path)
    assert [(p.kind, p.offset) for p in report.problems] == [("torn tail", start)]
    assert "checksum mismatch" in report.format()

    async with await Journal.open(path) as j:
        assert await drain(j, sync=False) == one + two
        assert seg.stat().st_size == start
        four = await write_batch(j, "four")
        assert await drain(j) == four
    assert (path / f"corrupt-{1:016d}-{start}.bad").exists()  # a complete batch: kept aside
    assert check(path).ok


async def test_crash_after_ack_and_before_rsync(tmp_path: Path) -> None:
    """kill -9 of a process that acked 3 writes, rsync'ed the first, read the second."""
    path = tmp_path / "j"
    script = f"""
import asyncio, sys
from pathlib import Path
from queue_daemon.journal import Journal

async def main():
    j = await Journal.open(Path({str(path)!r}))
    for i in range(3):
        await j.write("acme-mail", [f"id{{i}}"], [f"p{{i}}"], create_ms=1, dt_ms=2)
    r = j.read_reserve(1, 60)
    await j.read(r)
    await j.rsync(r)
    r = j.read_reserve(1, 60)
    await j.read(r)
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
        with pytest.raises(JournalError, match="in use by another process"):
            await Journal.open(path)
    finally:
        proc.kill()  # SIGKILL: no close, no flush, no cleanup
        await proc.wait()
    async with await Journal.open(path) as j:
        assert [e.id for e in await drain(j)] == ["id1", "id2"]


# ---- reading -------------------------------------------------------------------------------


async def test_reservation_expires_and_is_reserved_again_first(journal: Journal) -> None:
    a = await write_batch(journal, "a")
    b = await write_batch(journal, "b")
    ra = journal.read_reserve(1, 0.05)
    assert ra is not None
    assert await journal.read(ra) == a
    rb = journal.read_reserve(1, 60)
    assert rb is not None
    assert await journal.read(rb) == b
    c = await write_batch(journal, "c")
    assert await journal.wait_readable(5)  # "c" is readable at once
    assert await journal.read(journal.read_reserve(1, 60) or ra) == c
    assert journal.read_reserve(1, 60) is None
    assert await journal.wait_readable(5)  # woken by the expiry of ra
    again = journal.read_reserve(10, 60)
    assert again is not None
    assert await journal.read(again) == a
    await journal.rsync(again)
    await journal.rsync(rb)
    assert journal.lag.unread_lines == 1  # "c", reserved and read, never rsync'ed


async def test_reserve_takes_whole_batches(journal: Journal) -> None:
    await write_batch(journal, "big", 5)
    await write_batch(journal, "small1", 1)
    await write_batch(journal, "small2", 1)
    r = journal.read_reserve(2, 60)
    assert r is not None
    assert r.lines == 5  # at least one batch, even if larger
    r = journal.read_reserve(2, 60)
    assert r is not None
    assert r.lines == 2
    assert journal.read_reserve(2, 60) is None


async def test_reserve_is_sized_in_bytes_too(journal: Journal) -> None:
    """Big payloads: a reservation stops at its byte budget as at its line count,
    and still takes one batch however large."""
    for name in ("a", "b", "c"):
        await journal.write("acme-mail", [name], [name * 1000], create_ms=0, dt_ms=0)
    first = journal.read_reserve(100, 60, max_bytes=1500)
    assert first is not None and first.lines == 1
    rest = journal.read_reserve(100, 60, max_bytes=5000)
    assert rest is not None and rest.lines == 2
    assert [e.payload for e in await journal.read(rest)] == ["b" * 1000, "c" * 1000]


async def test_wait_readable_times_out(journal: Journal) -> None:
    assert not await journal.wait_readable(0.01)
    waiter = asyncio.create_task(journal.wait_readable(10))
    await write_batch(journal, "x")
    assert await waiter


async def test_lag(journal: Journal) -> None:
    assert journal.lag.unread_lines == 0
    assert journal.lag.oldest_unread_ms is None
    await journal.write("acme-mail", ["a", "b"], ["x", "y"], create_ms=500, dt_ms=600)
    await journal.write("acme-mail", ["c"], ["z"], create_ms=700, dt_ms=800)
    lag = journal.lag
    assert (lag.unread_lines, lag.oldest_unread_ms) == (3, 500)
    assert lag.unread_bytes > 0
    r = journal.read_reserve(2, 60)
    assert r is not None
    await journal.rsync(r)
    lag = journal.lag
    assert (lag.unread_lines, lag.oldest_unread_ms) == (1, 700)
    await drain(journal)
    assert journal.lag.unread_bytes == 0


async def test_read_point_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        await write_batch(j, "one")
        two = await write_batch(j, "two")
        three = await write_batch(j, "three")
        r = j.read_reserve(1, 60)
        assert r is not None
        await j.read(r)
        await j.rsync(r)
    async with await Journal.open(path) as j:
        assert j.lag.unread_lines == 2
        r = j.read_reserve(1, 60)
        assert r is not None
        assert await j.read(r) == two  # read but never rsync'ed: comes back
    async with await Journal.open(path) as j:
        assert await drain(j) == two + three
    async with await Journal.open(path) as j:
        assert j.read_reserve(10, 60) is None
        r_new = await write_batch(j, "four")
        r = j.read_reserve(10, 60)
        assert r is not None
        assert r.first_seq == 4  # seq continues across restarts
        assert await j.read(r) == r_new


async def test_read_point_only_passes_contiguous_rsyncs(tmp_path: Path) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        a = await write_batch(j, "a")
        b = await write_batch(j, "b")
        ra, rb = j.read_reserve(1, 60), j.read_reserve(1, 60)
        assert ra is not None
        assert rb is not None
        await j.rsync(rb)
    async with await Journal.open(path) as j:
        assert await drain(j) == a + b  # at least once: b comes back with a


async def test_rotation_and_deletion(tmp_path: Path) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path, segment_bytes=1) as j:
        batches = [await write_batch(j, f"b{i}") for i in range(5)]
        assert segment_files(path) == [segment_name(n) for n in range(1, 6)]
        for _ in range(2):
            r = j.read_reserve(1, 60)
            assert r is not None
            await j.rsync(r)
        assert segment_files(path) == [segment_name(n) for n in range(3, 6)]
    async with await Journal.open(path, segment_bytes=1) as j:
        assert await drain(j) == batches[2] + batches[3] + batches[4]
        assert segment_files(path) == [segment_name(5)]  # the one being appended to stays
        six = await write_batch(j, "b5")
        assert segment_files(path) == [segment_name(5), segment_name(6)]
    async with await Journal.open(path, segment_bytes=1) as j:
        assert await drain(j) == six
    report = check(path)
    assert report.ok
    assert report.lines_unread == 0


async def test_lock(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = await Journal.open(path)
    with pytest.raises(JournalError, match="in use by another process"):
        await Journal.open(path)
    await j.close()
    await (await Journal.open(path)).close()


async def test_closed_journal(tmp_path: Path) -> None:
    j = await Journal.open(tmp_path / "j")
    await j.close()
    await j.close()  # idempotent
    assert not j.writable
    with pytest.raises(JournalUnavailable):
        await write_batch(j, "x")
    with pytest.raises(JournalError):
        j.read_reserve(1, 1)
    assert not await j.wait_readable(1)


# ---- check ---------------------------------------------------------------------------------


async def test_check_healthy(tmp_path: Path) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path, segment_bytes=1) as j:
        for i in range(3):
            await write_batch(j, f"b{i}", 2)
        r = j.read_reserve(1, 60)
        assert r is not None
        await j.rsync(r)
    report = check(path)
    assert report.ok, report.format()
    assert report.batches == 2
    assert report.lines_total == 4
    assert report.lines_unread == 4
    assert report.read_point is not None
    assert report.read_point.position == (2, 0)
    text = report.format()
    assert "OK" in text
    assert segment_name(2) in text


async def test_check_damaged(tmp_path: Path) -> None:
    path = tmp_path / "j"
    async with await Journal.open(path) as j:
        for i in range(6):
            await write_batch(j, f"b{i}", 2)
    seg = path / segment_name(1)
    offsets = batch_offsets(seg)
    data = bytearray(seg.read_bytes())
    data[offsets[1][0] + 5] ^= 0x01  # "#:Batch" of the 2nd batch
    data[offsets[3][1] - 20] ^= 0x01  # body of the 4th
    seg.write_bytes(bytes(data[: offsets[5][1] - 5]))  # the 6th torn
    report = check(path)
    assert not report.ok
    assert [(p.kind, p.offset) for p in report.problems] == [
        ("corrupt", offsets[1][0]),
        ("corrupt", offsets[3][0]),
        ("torn tail", offsets[5][0]),
    ]
    assert (report.batches, report.lines_total) == (3, 6)
    text = report.format()
    assert "PROBLEMS FOUND" in text
    assert f"{segment_name(1)}:{offsets[5][0]}: torn tail: incomplete batch" in text
    async with await Journal.open(path) as j:
        assert [e.id for e in await drain(j)] == ["b0-0", "b0-1", "b2-0", "b2-1", "b4-0", "b4-1"]
    report = check(path)
    assert [p.kind for p in report.problems] == ["corrupt", "corrupt"]  # skipped, not erased
    assert report.lines_unread == 0
    assert len(report.bad_files) == 2


def test_check_missing_directory(tmp_path: Path) -> None:
    assert not check(tmp_path / "nope").ok

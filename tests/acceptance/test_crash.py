"""kill -9 loses no acknowledged job and ingests none twice (docs/architecture.md, 1 and 2).

A real daemon is killed by SIGKILL while concurrent clients post; a new daemon
on the same data directory adopts the dead one's journal. Then the store is
read directly: every id that got a 200 is there, exactly once, with its payload.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api, until
from harness.daemons import (
    DaemonFactory,
    DaemonProcess,
    add_tenant,
    journal_dirs,
    only_journal,
)
from queue_daemon.store.embedded import stop_server
from tests.acceptance.storecheck import duplicates, fetch_counts, payloads, wait_all_stored

CLIENTS = 8
LINES = (1, 50, 1, 7, 1, 50, 3, 1)  # lines per request, by client
KILL_AFTER_IDS = 3000  # acknowledged ids before the kill (or KILL_AFTER_S, whichever first)
KILL_AFTER_S = 4.0
INGEST_WITHIN = 60.0


async def _post_until_refused(
    api: Api, number: int, acked: dict[str, str], stop: asyncio.Event
) -> int:
    """Post ``LINES[number]``-line requests until the daemon is gone; return requests sent."""
    for request in itertools.count():
        if stop.is_set():
            return request
        lines = [f"c{number}-r{request}-l{k}" for k in range(LINES[number])]
        try:
            reply = await api.add_raw("crash", "\n".join(lines) + "\n")
        except (aiohttp.ClientError, TimeoutError):
            return request  # the daemon died with this request in flight: not acknowledged
        if reply.status != 200:
            # a request cut by the kill may fail any way; one before it must not
            assert stop.is_set(), f"add failed while the daemon was up: {reply}"
            return request
        acked.update(zip(reply.json["ids"], lines, strict=True))
    raise AssertionError("unreachable")


async def _load_then_kill(api: Api, daemon: DaemonProcess, acked: dict[str, str]) -> None:
    """Concurrent clients post; SIGKILL the daemon mid-stream; the clients stop on errors."""
    stop = asyncio.Event()
    before = len(acked)
    workers = [
        asyncio.create_task(_post_until_refused(api, n, acked, stop)) for n in range(CLIENTS)
    ]

    async def enough() -> bool | None:
        for worker in workers:
            if worker.done():
                worker.result()  # surface an assertion of a worker
        return True if len(acked) - before >= KILL_AFTER_IDS else None

    try:
        await until(enough, KILL_AFTER_S, "acknowledged ids", interval=0.01)
    except AssertionError:
        if len(acked) - before < 100:
            raise
    daemon.kill()
    stop.set()
    sent = await asyncio.wait_for(asyncio.gather(*workers), 30)
    assert sum(sent) > CLIENTS, "the clients barely posted"


async def test_kill_9_mid_stream_loses_and_duplicates_nothing(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    token = add_tenant("crash", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    acked: dict[str, str] = {}
    daemon = daemons.start(data_dir, pg_dsn, "--lease", "5")
    for _ in range(2):  # crash, restart, crash again, restart
        await _load_then_kill(Api(session, daemon.url, "crash", token), daemon, acked)
        assert len(acked) >= 100
        daemon = daemons.start(data_dir, pg_dsn, "--lease", "5")
        await wait_all_stored(pg_dsn, acked, INGEST_WITHIN)

    assert await duplicates(pg_dsn) == []
    assert await payloads(pg_dsn, acked) == acked, "stored payloads differ from the posted ones"
    # journals of dead daemons are adopted, not left behind: at most one per daemon ever run
    assert len(journal_dirs(data_dir)) <= 3
    api = Api(session, daemon.url, "crash", token)
    for job_id in list(acked)[:: max(1, len(acked) // 20)]:
        assert (await api.get_job(job_id)).status == 200


HEADER_RE = re.compile(rb"#:Batch seq=(\d+),")


def _torn_tail(segment: bytes, variant: str) -> bytes:
    """Bytes that a crash could have left after the last complete batch."""
    seqs = [int(m[1]) for m in HEADER_RE.finditer(segment)]
    seq = (max(seqs) if seqs else 0) + 1
    line = b"ffffffffffff0-torn|1700000000000|1700000000000|crash-crash|torn payload\n"
    if variant == "half batch":
        # a real-looking header whose body never made it to disk in full
        header = (
            f"#:Batch seq={seq},date=2026-01-01T00:00:00.000Z,lines=3,"
            f"bytes={3 * len(line)},crc=0badf00d\n"
        ).encode()
        return header + line + line[:20]
    if variant == "header fragment":
        return f"#:Batch seq={seq},date=2026-01-01T00:0".encode()
    if variant == "whole batch, bad checksum":
        header = (
            f"#:Batch seq={seq},date=2026-01-01T00:00:00.000Z,lines=1,"
            f"bytes={len(line)},crc=0badf00d\n"
        ).encode()
        return header + line + b"#:EndBatch\n"
    assert variant == "garbage"
    return os.urandom(4096).replace(b"#", b"?")


def _append_to_last_segment(journal_dir: Path, variant: str) -> None:
    segments = sorted(journal_dir.glob("seg-*.log"))
    assert segments, f"no segment in {journal_dir}: {list(journal_dir.iterdir())}"
    last = segments[-1]
    with last.open("ab") as f:
        f.write(_torn_tail(last.read_bytes(), variant))
        f.flush()
        os.fsync(f.fileno())


@pytest.mark.parametrize(
    "variant", ["half batch", "header fragment", "whole batch, bad checksum", "garbage"]
)
async def test_torn_journal_tail_after_kill_9_loses_nothing(
    pg_dsn: str,
    daemons: DaemonFactory,
    data_dir: Path,
    session: aiohttp.ClientSession,
    variant: str,
) -> None:
    token = add_tenant("crash", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, "crash", token)
    acked: dict[str, str] = {}
    for n, size in enumerate((1, 50, 2, 20, 1)):
        lines = [f"r{n}-l{k}" for k in range(size)]
        acked.update(zip(await api.add("crash", lines), lines, strict=True))
    daemon.kill()

    _append_to_last_segment(only_journal(data_dir), variant)

    daemons.start(data_dir, pg_dsn)
    counts = await wait_all_stored(pg_dsn, acked, INGEST_WITHIN)
    assert await duplicates(pg_dsn) == []
    assert set(counts) == set(acked), f"jobs nobody acknowledged: {set(counts) - set(acked)}"
    assert await payloads(pg_dsn, acked) == acked
    assert "ffffffffffff0-torn" not in await fetch_counts(pg_dsn)


async def test_kill_9_after_the_journal_rotated_loses_nothing(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    """More than one 64 MiB segment: the dead daemon's journal spans a rotation."""
    token = add_tenant("big", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, "big", token)
    acked: dict[str, str] = {}
    filler = "x" * 1000
    for request in range(9):  # 9 x 8 MiB: the journal rotates past 64 MiB
        lines = [f"{request}-{k}-{filler}" for k in range(8 * 1024)]
        acked.update(zip(await api.add("big", lines), lines, strict=True))
    for request in range(3):
        lines = [f"after-{request}-{k}" for k in range(10)]
        acked.update(zip(await api.add("big", lines), lines, strict=True))
    daemon.kill()
    journal_dir = only_journal(data_dir)
    assert max(journal_dir.glob("seg-*.log")).name != "seg-0000000000000001.log", (
        f"the journal did not rotate: {sorted(p.name for p in journal_dir.iterdir())}"
    )

    daemon = daemons.start(data_dir, pg_dsn)
    await wait_all_stored(pg_dsn, acked, INGEST_WITHIN)
    assert await duplicates(pg_dsn) == []
    assert await payloads(pg_dsn, acked) == acked
    await Api(session, daemon.url, "big", token).wait_caught_up(INGEST_WITHIN)


async def test_kill_9_with_the_embedded_store(
    daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> None:
    """The default (no --store): tenant first, as a user would; kill -9; restart; SIGTERM."""
    pgdata = data_dir / "pg"  # tmp_path is absolute and resolved
    try:
        token = add_tenant("emb", store=None, data_dir=data_dir, cwd=data_dir.parent)
        daemon = daemons.start(data_dir, None)
        api = Api(session, daemon.url, "emb", token)
        acked: dict[str, str] = {}
        for n in range(5):
            lines = [f"e{n}-{k}" for k in range(30)]
            acked.update(zip(await api.add("t", lines), lines, strict=True))
        daemon.kill()  # leaves the embedded server running, with nobody using it

        daemon = daemons.start(data_dir, None)
        api = Api(session, daemon.url, "emb", token)
        for job_id in acked:
            await api.wait_job(job_id)
        assert daemon.terminate() == 0, daemon.stderr_text()[-3000:]
        assert not (pgdata / "postmaster.pid").exists(), "the last daemon left the server up"
    finally:
        for started in daemons.started:
            started.close()  # before their server goes
        stop_server(pgdata)

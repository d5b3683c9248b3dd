"""``queue-daemon journal check DIR`` on the journal a real daemon wrote."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from harness.api import Api
from harness.daemons import DaemonFactory, add_tenant, only_journal, run_cli

REQUESTS = (10, 20, 5)  # lines per request: one batch each


@pytest.fixture
async def journal_dir(
    pg_dsn: str, daemons: DaemonFactory, data_dir: Path, session: aiohttp.ClientSession
) -> AsyncIterator[Path]:
    """The journal of a daemon that took ``REQUESTS`` and was then stopped."""
    token = add_tenant("j", store=pg_dsn, data_dir=data_dir, cwd=data_dir.parent)
    daemon = daemons.start(data_dir, pg_dsn)
    api = Api(session, daemon.url, "j", token)
    for number, size in enumerate(REQUESTS):
        ids = await api.add("t", [f"MARKER-{number}-{k}-payload" for k in range(size)])
        await api.wait_job(ids[-1])
    assert daemon.terminate() == 0
    yield only_journal(data_dir)


def _check(path: Path, cwd: Path) -> tuple[int, str]:
    done = run_cli("journal", "check", str(path), cwd=cwd)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def _numbers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\b\d+\b", text)}


def test_check_of_a_stopped_daemons_journal_prints_counts(journal_dir: Path) -> None:
    code, out = _check(journal_dir, journal_dir.parent)
    assert code == 0, out
    assert sum(REQUESTS) in _numbers(out), f"no line count {sum(REQUESTS)} in:\n{out}"
    assert len(REQUESTS) in _numbers(out), f"no batch count {len(REQUESTS)} in:\n{out}"


def _last_segment(directory: Path) -> Path:
    segments = sorted(directory.glob("seg-*.log"))
    assert segments, f"no segments in {directory}: {list(directory.iterdir())}"
    return segments[-1]


def test_check_names_a_flipped_byte_in_a_batch_body(journal_dir: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(journal_dir, damaged)
    segment = _last_segment(damaged)
    data = bytearray(segment.read_bytes())
    where = data.find(b"MARKER-1-")
    assert where > 0, "the payloads are not in the segment as written"
    data[where + 3] ^= 0x01
    segment.write_bytes(bytes(data))

    code, out = _check(damaged, tmp_path)
    assert code != 0, out
    assert segment.name in out, f"the damaged segment is not named:\n{out}"
    assert re.search(r"checksum|crc|corrupt", out, re.IGNORECASE), out
    # the check reads only: the original is untouched and still fine
    assert _check(journal_dir, tmp_path)[0] == 0


def test_check_names_a_torn_tail(journal_dir: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "torn"
    shutil.copytree(journal_dir, damaged)
    segment = _last_segment(damaged)
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - 7])  # the last batch lost its last bytes

    code, out = _check(damaged, tmp_path)
    assert code != 0, out
    assert segment.name in out and "torn" in out.lower(), out


def test_check_of_something_that_is_no_journal_fails_cleanly(tmp_path: Path) -> None:
    code, out = _check(tmp_path / "nosuch", tmp_path)
    assert code != 0, out
    assert out.strip(), "no message"

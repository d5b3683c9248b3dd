"""The queue log's writer and its readers share one schema (observe/records.py):
every record the writer makes has the fields its kind declares, in that order,
and the readers' ``read_head`` reads it back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson

from queue_daemon.domain.jobs import ClaimedJob, ExpiredLock, Release, ReleaseHow, epoch_ms
from queue_daemon.observe.queuelog import QueueLog
from queue_daemon.observe.records import FIELDS, HEAD, Ev, read_head


async def test_every_kind_written_has_exactly_its_declared_fields(tmp_path: Path) -> None:
    log = QueueLog(tmp_path / "queue.log", sysid="s1")
    job = ClaimedJob(
        id="j1", type="acme-t", data="p", attempts=1, created_ms=epoch_ms(datetime.now(UTC))
    )
    log.added("acme-t", ["j1"], ["p"], 1000, 1000)
    log.started("acme-t", [job])
    log.finished(
        "acme-t",
        [Release(id="j1", how=ReleaseHow.RETRY, code="retry", exitcode=500, delay=1.0)],
        attempts={"j1": 1},
        run_ms={"j1": 2.5},
    )
    log.lost_lease(
        "acme-t",
        [Release(id="j1", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200)],
        attempts={"j1": 1},
        run_ms={"j1": 2.5},
    )
    log.expired([ExpiredLock("j1", "acme-t", 1)])
    log.cancelled("acme-t", "j1")
    log.purged({"acme-t": 3})
    log.log("acme-t", "j1", ["hello"])
    log.tick("acme-t", "j1", "nightly", 1000, catchup=True)
    log.blocked("acme-t", ["j1"], 2)
    log.unblocked([("j1", "acme-t")])
    log.deadline([("j1", "acme-t", True)])
    await log.close()
    seen = set()
    for raw in (tmp_path / "queue.log").read_bytes().splitlines():
        record = orjson.loads(raw)
        ev = Ev(record["ev"])
        seen.add(ev)
        assert tuple(record) == HEAD + FIELDS[ev], (ev, tuple(record))
        parsed = read_head(raw)
        assert parsed is not None and parsed[:4] == (ev.value, record["t"], "acme", "t")
    assert seen == set(Ev)


def test_lines_of_earlier_versions_and_garbage() -> None:
    old = read_head(b'{"ev":"added","t":5,"type":"acme-resize-big","id":"x"}')
    assert old is not None and old[:4] == ("added", 5, "acme", "resize-big")
    for bad in (b"", b"{", b"[]", b'{"ev":"added"}', b'{"ev":1,"t":5,"type":"a-b"}'):
        assert read_head(bad) is None

"""The queue logfile: one JSON line per job event, and the analytics read from it."""

from __future__ import annotations

from pathlib import Path

import orjson

from queue_daemon.queuelog import QueueLog, summarize
from store.models import Release, ReleaseHow


async def test_events_are_json_lines_and_summarize_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "queue.log"
    log = QueueLog(path)
    log.added("acme-resize", ["1-1", "2-1", "3-1"], 1_700_000_000_000)
    log.event("started", "acme-resize", ["1-1", "2-1"])
    log.finished(
        "acme-resize",
        [
            Release(id="1-1", how=ReleaseHow.ARCHIVE, code="ok", exitcode=200),
            Release(id="2-1", how=ReleaseHow.RETRY, code="error", exitcode=500, delay=1),
        ],
    )
    log.log("acme-resize", "1-1", ['said "hi"', "\x00 and | and #:"])
    await log.close()
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["ev"] for r in records] == ["added"] * 3 + ["started"] * 2 + ["finished"] * 2 + [
        "log"
    ]
    assert records[0] == {"ev": "added", "t": 1_700_000_000_000, "type": "acme-resize", "id": "1-1"}
    assert records[-1]["lines"] == ['said "hi"', "\x00 and | and #:"]
    assert summarize([path]) == {
        "acme-resize": {
            "added": 3,
            "started": 2,
            "finished_ok": 1,
            "finished_error": 1,
            "log": 1,
        }
    }

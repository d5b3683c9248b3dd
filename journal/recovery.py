"""Opening a journal directory: lock, read point, scan forward, repair the tail.

Blocking: the journal runs ``recover`` in an executor.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from queue_daemon.journal.format import INCOMPLETE, Damage, first_create_ms, scan, segment_name
from queue_daemon.journal.models import BatchRecord
from queue_daemon.journal.readpoint import ReadPoint, ReadPointFile, load_read_point
from queue_daemon.journal.segments import (
    SegmentWriter,
    acquire_lock,
    create_segment,
    delete_segments,
    list_segments,
    release_lock,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class Recovered:
    batches: list[BatchRecord]  # durable, after the read point, in order
    segments: list[int]
    read_point: ReadPoint
    durable_end: tuple[int, int]
    max_seq: int
    writer: SegmentWriter
    read_point_file: ReadPointFile
    lock_fd: int


def bad_file_name(segment: int, offset: int) -> str:
    return f"corrupt-{segment:016d}-{offset}.bad"


def _save_bad(directory: Path, segment: int, offset: int, data: bytes) -> Path:
    path = directory / bad_file_name(segment, offset)
    if not path.exists():
        path.write_bytes(data)
    return path


def _report_damage(directory: Path, segment: int, d: Damage, data: bytes, base: int) -> None:
    name = segment_name(segment)
    if d.tail and d.reason == INCOMPLETE:
        # The normal trace of a crash during an append: that write was never acknowledged.
        logger.warning(
            "journal: torn tail at %s:%d (%d bytes) truncated",
            name,
            d.offset,
            d.end - d.offset,
            extra={
                "action": "journal_torn_tail",
                "segment": name,
                "offset": d.offset,
                "length": d.end - d.offset,
            },
        )
        return
    saved = _save_bad(directory, segment, d.offset, data[d.offset - base : d.end - base])
    logger.error(
        "journal: %s at %s:%d (%d bytes) skipped, saved to %s",
        d.reason,
        name,
        d.offset,
        d.end - d.offset,
        saved.name,
        extra={
            "action": "journal_corrupt",
            "segment": name,
            "offset": d.offset,
            "length": d.end - d.offset,
            "reason": d.reason,
            "saved_to": str(saved),
            "truncated": d.tail,
        },
    )


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan_segment(
    directory: Path, segment: int, start: int, last: bool, batches: list[BatchRecord]
) -> tuple[int, int]:
    """Append the segment's valid batches from ``start``; returns (size after repair, max seq)."""
    path = directory / segment_name(segment)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    size = start + len(data)
    max_seq = 0
    for item in scan(data, start):
        if isinstance(item, Damage):
            _report_damage(directory, segment, item, data, start)
            if item.tail and last:
                _truncate(path, item.offset)
                size = item.offset
            continue
        max_seq = max(max_seq, item.seq)
        batches.append(
            BatchRecord(
                seq=item.seq,
                segment=segment,
                offset=item.offset,
                end=item.end,
                body_offset=item.body_offset,
                body_len=item.body_len,
                crc=item.crc,
                lines=item.lines,
                create_ms=first_create_ms(data, item.body_offset - start),
                seen=True,
            )
        )
    return size, max_seq


def _recover_locked(directory: Path, segment_bytes: int, lock_fd: int) -> Recovered:
    rp = load_read_point(directory) or ReadPoint(1, 0, 0)
    segments = list_segments(directory)
    stale = [s for s in segments if s < rp.segment]
    if stale:  # ingested, but we crashed before deleting them
        delete_segments(directory, stale)
        segments = segments[len(stale) :]
    if not segments:
        first = rp.segment + 1 if rp.offset > 0 else rp.segment
        create_segment(directory, first)
        segments = [first]
    if segments[0] > rp.segment:
        rp = ReadPoint(segments[0], 0, rp.seq)

    batches: list[BatchRecord] = []
    max_seq = rp.seq
    last_size = 0
    rotate = False
    durable_end = (0, 0)
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        start = rp.offset if seg == rp.segment else 0
        file_size = os.stat(directory / segment_name(seg)).st_size
        if start > file_size:
            logger.error(
                "journal: read point %s:%d is past the end of the segment (%d bytes)",
                segment_name(seg),
                start,
                file_size,
                extra={"action": "journal_read_point_past_end", "segment": segment_name(seg)},
            )
            if last:  # appending here would land before the read point
                last_size, rotate, durable_end = file_size, True, (seg, start)
            continue
        last_size, seq = _scan_segment(directory, seg, start, last, batches)
        max_seq = max(max_seq, seq)
        durable_end = (seg, last_size)
    rp = ReadPoint(rp.segment, rp.offset, max_seq)
    rp_file = ReadPointFile(directory)
    rp_file.rewrite(rp)  # also drops a torn last record
    writer = SegmentWriter(directory, segments[-1], last_size, segment_bytes, rotate)
    return Recovered(
        batches=batches,
        segments=segments,
        read_point=rp,
        durable_end=durable_end,
        max_seq=max_seq,
        writer=writer,
        read_point_file=rp_file,
        lock_fd=lock_fd,
    )


def recover(directory: Path, segment_bytes: int) -> Recovered:
    """Lock the directory and bring it to a state where appends follow valid data."""
    # acknowledged jobs are tenants' data: private to the daemon's user
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock_fd = acquire_lock(directory)
    try:
        return _recover_locked(directory, segment_bytes, lock_fd)
    except BaseException:
        release_lock(lock_fd)
        raise

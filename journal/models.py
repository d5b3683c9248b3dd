"""Plain data the journal hands out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Entry:
    """One job line of the journal, as the ingester reads it."""

    id: str
    create_ms: int  # epoch milliseconds
    dt_ms: int  # epoch milliseconds: first eligible time
    type: str  # "client-type"
    payload: str
    opts: str = ""  # the job's options, opaque to the journal (queue_daemon.domain.options)


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalLag:
    """What is durable in the journal but not yet ingested (rsync'ed)."""

    unread_lines: int
    unread_bytes: int
    oldest_unread_ms: int | None  # create time of the first un-rsync'ed batch


@dataclass(slots=True, eq=False)
class BatchRecord:
    """Where one durable batch lives, and its read state (internal)."""

    seq: int
    segment: int
    offset: int  # of the "#:Batch" header
    end: int  # just past "#:EndBatch\n"
    body_offset: int
    body_len: int
    crc: int
    lines: int
    create_ms: int  # of the first line
    body: str | None = None  # kept while cached in memory
    reserved_by: int = 0  # reservation id, 0 when not reserved
    synced: bool = False
    # may be in the store already: found on disk at start-up (written before
    # the journal was opened), or handed out before and not rsync'ed
    seen: bool = False
    tag: object = None  # the writer's, for the reader (Journal.write)

    @property
    def size(self) -> int:
        return self.end - self.offset


@dataclass(slots=True, eq=False, kw_only=True)
class Reservation:
    """Whole batches handed to one reader until rsync'ed or expired."""

    id: int
    lines: int
    expires_at: float  # time.monotonic()
    batches: tuple[BatchRecord, ...] = field(repr=False)

    @property
    def first_seq(self) -> int:
        return self.batches[0].seq

    @property
    def fresh(self) -> bool:
        """No line of it can be in the store yet: each batch is read for the first
        time since the daemon that holds the journal wrote it."""
        return not any(b.seen for b in self.batches)

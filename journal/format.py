"""The on-disk batch format: encoding, frame parsing, segment scanning.

A segment is a sequence of framed batches::

    #:Batch seq=<seq>,date=<ISO-8601 UTC ms>,lines=<k>,bytes=<N>,crc=<crc32 8 hex>\\n
    <body: exactly N bytes, k lines "<id>|<create_ms>|<dt_ms>|<type>|<payload>\\n">

The dt field may carry the job's options after it: ``<dt_ms>;<options>``
(``Entry.opts``, opaque here; written only when an add has options, so lines
without them read as they always did).
    #:EndBatch\\n

The body is byte-counted and checksummed, so a payload that looks like a frame
line can never break the framing. Everything here is pure (no file I/O).
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from queue_daemon.journal.models import Entry

BATCH_PREFIX = b"#:Batch "
TRAILER = b"#:EndBatch\n"
_TRAILER_WORD = TRAILER[:-1]
INCOMPLETE = "incomplete batch"

# Longest possible header is ~115 bytes; anything without a newline by then is garbage.
_MAX_HEADER = 160
_HEADER_RE = re.compile(
    rb"#:Batch seq=(\d{1,19}),date=[0-9T:.\-Z]{1,32},lines=(\d{1,10}),"
    rb"bytes=(\d{1,15}),crc=([0-9a-f]{8})\n"
)
_SEGMENT_RE = re.compile(r"seg-(\d{16})\.log")


def segment_name(number: int) -> str:
    return f"seg-{number:016d}.log"


def parse_segment_name(name: str) -> int | None:
    m = _SEGMENT_RE.fullmatch(name)
    return int(m.group(1)) if m else None


_last_second: list[tuple[int, str]] = [(-1, "")]  # every batch header formats a date


def iso_ms(t: float) -> str:
    """``t`` (epoch seconds) as ISO-8601 UTC with milliseconds, e.g. 2024-05-01T12:00:00.123Z."""
    s, ms = divmod(int(t * 1000), 1000)
    cached_s, text = _last_second[0]
    if cached_s != s:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
        _last_second[0] = (s, text)
    return f"{text}.{ms:03d}Z"


@dataclass(slots=True)
class EncodedBatch:
    seq: int
    record: bytes  # header + body + trailer, ready to append
    body: str
    header_len: int
    body_len: int
    lines: int
    crc: int


def encode_batch(
    seq: int,
    type: str,
    ids: Sequence[str],
    payloads: Sequence[str],
    *,
    create_ms: int,
    dt_ms: int,
    opts: str = "",
    now: float | None = None,
) -> EncodedBatch:
    """Frame one batch; ValueError if the input cannot be represented."""
    n = len(ids)
    if n != len(payloads):
        raise ValueError(f"{n} ids but {len(payloads)} payloads")
    if n == 0:
        raise ValueError("empty batch")
    if "|" in type or "\n" in type:
        raise ValueError("type must not contain '|' or a newline")
    if "|" in "".join(ids):
        raise ValueError("an id contains '|'")
    if opts and ("|" in opts or "\n" in opts):
        raise ValueError("options must not contain '|' or a newline")
    mid = f"|{create_ms:d}|{dt_ms:d}{';' if opts else ''}{opts}|{type}|"
    body = "".join([f"{i}{mid}{p}\n" for i, p in zip(ids, payloads, strict=True)])
    # One count catches a newline in any payload or id.
    if body.count("\n") != n:
        raise ValueError("a payload or id contains a newline")
    data = body.encode()
    crc = zlib.crc32(data)
    date = iso_ms(time.time() if now is None else now)
    header = f"#:Batch seq={seq},date={date},lines={n},bytes={len(data)},crc={crc:08x}\n".encode()
    return EncodedBatch(
        seq=seq,
        record=b"".join((header, data, TRAILER)),
        body=body,
        header_len=len(header),
        body_len=len(data),
        lines=n,
        crc=crc,
    )


def parse_body(body: str) -> list[Entry]:
    """The entries of a verified body; ValueError if a line is malformed."""
    lines = body.split("\n")
    if lines.pop() != "":
        raise ValueError("body does not end with a newline")
    out: list[Entry] = []
    append = out.append
    last_c = last_d = opts = ""
    c_ms = d_ms = 0
    for line in lines:
        i, c, d, t, p = line.split("|", 4)
        # Lines of one write share create/dt: skip re-parsing the same digits.
        if c != last_c:
            c_ms, last_c = int(c), c
        if d != last_d:
            last_d = d
            d, _, opts = d.partition(";")
            d_ms = int(d)
        append(Entry(i, c_ms, d_ms, t, p, opts))
    return out


def first_create_ms(data: bytes, body_offset: int) -> int:
    """create_ms of the first line of a verified body (0 if unreadable)."""
    a = data.find(b"|", body_offset)
    b = data.find(b"|", a + 1)
    try:
        return int(data[a + 1 : b])
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class Frame:
    """A complete, checksum-verified batch found in a segment."""

    offset: int
    end: int
    seq: int
    lines: int
    body_offset: int
    body_len: int
    crc: int


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [offset, end) of a segment that hold no valid batch."""

    offset: int
    end: int
    reason: str
    tail: bool  # nothing valid follows in this segment


def parse_frame(data: bytes, pos: int, base: int = 0) -> Frame | str:
    """The frame starting at ``data[pos]``, or why there is none (offsets + ``base``)."""
    if not BATCH_PREFIX.startswith(data[pos : pos + len(BATCH_PREFIX)]):
        return "bad header"
    nl = data.find(b"\n", pos, pos + _MAX_HEADER)
    if nl < 0:
        return INCOMPLETE if len(data) - pos < _MAX_HEADER else "bad header"
    m = _HEADER_RE.match(data, pos)
    if m is None or m.end() != nl + 1:
        return "bad header"
    seq, lines, nbytes, crc = int(m[1]), int(m[2]), int(m[3]), int(m[4], 16)
    body_offset = nl + 1
    body_end = body_offset + nbytes
    end = body_end + len(TRAILER)
    if end > len(data):
        return INCOMPLETE
    if data[body_end:end] != TRAILER:
        return "bad trailer"
    if zlib.crc32(memoryview(data)[body_offset:body_end]) != crc:
        return "checksum mismatch"
    if lines < 1 or data.count(b"\n", body_offset, body_end) != lines or data[body_end - 1] != 10:
        return "line count mismatch"
    return Frame(pos + base, end + base, seq, lines, body_offset + base, nbytes, crc)


def _at_line_start(data: bytes, q: int) -> bool:
    """Whether a header at ``q`` starts a line, or follows a trailer whose newline is damaged.

    Body lines always contain "|" and headers never do, so a payload cannot fake a
    header at a line start.
    """
    if data[q - 1] == 10:
        return True
    t = q - 1 - len(_TRAILER_WORD)
    return t >= 0 and data[t : q - 1] == _TRAILER_WORD and (t == 0 or data[t - 1] == 10)


def _next_frame(data: bytes, pos: int) -> int | None:
    """Position of the first valid frame after ``pos`` that starts a line."""
    q = pos + 1
    while True:
        q = data.find(BATCH_PREFIX, q)
        if q < 0:
            return None
        if _at_line_start(data, q) and isinstance(parse_frame(data, q), Frame):
            return q
        q += 1


def scan(data: bytes, base: int = 0) -> Iterator[Frame | Damage]:
    """Frames and damaged regions of segment bytes ``data`` read from offset ``base``."""
    pos = 0
    size = len(data)
    while pos < size:
        r = parse_frame(data, pos, base)
        if isinstance(r, Frame):
            yield r
            pos = r.end - base
            continue
        nxt = _next_frame(data, pos)
        if nxt is None:
            yield Damage(pos + base, size + base, r, tail=True)
            return
        yield Damage(pos + base, nxt + base, r, tail=False)
        pos = nxt

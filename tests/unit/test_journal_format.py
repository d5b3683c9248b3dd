"""The journal's on-disk format: encoding, frame parsing, scanning, read-point records."""

from __future__ import annotations

import re
import zlib

import pytest

from queue_daemon.journal import Entry
from queue_daemon.journal.format import (
    INCOMPLETE,
    TRAILER,
    Damage,
    Frame,
    encode_batch,
    iso_ms,
    parse_body,
    parse_frame,
    parse_segment_name,
    scan,
    segment_name,
)
from queue_daemon.journal.readpoint import ReadPoint, _encode, parse_read_point_file

NASTY = [
    "plain",
    "a|b|c|d|e",
    "#:Batch seq=1,date=2024-01-01T00:00:00.000Z,lines=1,bytes=5,crc=00000000",
    "#:EndBatch",
    "carriage\rreturn\r",
    "unicode é ✓ 🚀 \u2028 \x85 end",
    "",
    "|",
]


def _batch(seq: int = 1, n: int = 3, type: str = "acme-mail") -> bytes:
    ids = [f"id-{seq}-{i}" for i in range(n)]
    payloads = [f"payload {seq}/{i}" for i in range(n)]
    return encode_batch(seq, type, ids, payloads, create_ms=1000, dt_ms=2000).record


def test_segment_names() -> None:
    assert segment_name(1) == "seg-0000000000000001.log"
    assert parse_segment_name("seg-0000000000000042.log") == 42
    assert parse_segment_name("seg-42.log") is None
    assert parse_segment_name("seg-0000000000000042.log.tmp") is None


def test_iso_ms() -> None:
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1714564800.123) == "2024-05-01T12:00:00.123Z"


def test_encode_layout() -> None:
    b = encode_batch(7, "acme-mail", ["a", "b"], ["x|y", "#:EndBatch"], create_ms=5, dt_ms=6)
    text = b.record.decode()
    header, rest = text.split("\n", 1)
    m = re.fullmatch(
        r"#:Batch seq=7,date=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z,"
        r"lines=2,bytes=(\d+),crc=([0-9a-f]{8})",
        header,
    )
    assert m is not None
    body = "a|5|6|acme-mail|x|y\nb|5|6|acme-mail|#:EndBatch\n"
    assert rest == body + "#:EndBatch\n"
    assert int(m[1]) == len(body.encode()) == b.body_len
    assert int(m[2], 16) == zlib.crc32(body.encode()) == b.crc
    assert b.header_len == len(header) + 1
    assert b.lines == 2
    assert b.body == body


def test_round_trip_nasty_payloads() -> None:
    ids = [f"id{i}" for i in range(len(NASTY))]
    b = encode_batch(1, "c-t", ids, NASTY, create_ms=11, dt_ms=22)
    frame = parse_frame(b.record, 0)
    assert isinstance(frame, Frame)
    assert frame.lines == len(NASTY)
    body = b.record[frame.body_offset : frame.body_offset + frame.body_len].decode()
    assert parse_body(body) == [Entry(i, 11, 22, "c-t", p) for i, p in zip(ids, NASTY, strict=True)]


def test_parse_body_varied_times() -> None:
    body = "a|1|2|t|x\nb|3|4|u|y|z\nc|3|4|u|\n"
    assert parse_body(body) == [
        Entry("a", 1, 2, "t", "x"),
        Entry("b", 3, 4, "u", "y|z"),
        Entry("c", 3, 4, "u", ""),
    ]
    with pytest.raises(ValueError):
        parse_body("a|1|2|t\n")
    with pytest.raises(ValueError):
        parse_body("a|x|2|t|p\n")


@pytest.mark.parametrize(
    ("ids", "payloads", "type"),
    [
        (["a"], ["line\nbreak"], "c-t"),
        (["a", "b"], ["ok", "trailing\n"], "c-t"),
        (["a\nb"], ["ok"], "c-t"),
        (["a|b"], ["ok"], "c-t"),
        (["a"], ["ok"], "c|t"),
        (["a"], ["ok"], "c\nt"),
        (["a", "b"], ["ok"], "c-t"),
        ([], [], "c-t"),
    ],
)
def test_encode_rejects(ids: list[str], payloads: list[str], type: str) -> None:
    with pytest.raises(ValueError):
        encode_batch(1, type, ids, payloads, create_ms=1, dt_ms=1)


def test_scan_clean() -> None:
    data = _batch(1) + _batch(2, n=1) + _batch(3, n=5)
    items = list(scan(data))
    assert all(isinstance(i, Frame) for i in items)
    assert [i.seq for i in items if isinstance(i, Frame)] == [1, 2, 3]
    assert [i.lines for i in items if isinstance(i, Frame)] == [3, 1, 5]
    assert list(scan(b"")) == []


def test_scan_with_base_offset() -> None:
    a, b = _batch(1), _batch(2)
    items = list(scan(b, base=len(a)))
    assert isinstance(items[0], Frame)
    assert items[0].offset == len(a)
    assert items[0].end == len(a) + len(b)


def test_every_truncation_is_an_incomplete_tail() -> None:
    good = _batch(1)
    last = _batch(2, n=2)
    for cut in range(1, len(last)):
        items = list(scan(good + last[:cut]))
        assert isinstance(items[0], Frame)
        assert items[1:] == [Damage(len(good), len(good) + cut, INCOMPLETE, tail=True)], cut


def test_flipped_byte_in_middle_is_skipped() -> None:
    a, b, c = _batch(1), _batch(2), _batch(3)
    # seq and date are not covered by the checksum (the entries are): a digit flipped
    # there still yields a well-formed batch, which is harmless.
    m = re.match(rb"#:Batch seq=\d+,date=[^,]+,", b)
    assert m is not None
    for pos in range(m.end(), len(b)):
        bad = bytearray(b)
        bad[pos] ^= 0x01
        items = list(scan(a + bytes(bad) + c))
        frames = [i for i in items if isinstance(i, Frame)]
        damages = [i for i in items if isinstance(i, Damage)]
        assert [f.seq for f in frames] == [1, 3], pos
        assert len(damages) == 1
        assert (damages[0].offset, damages[0].end) == (len(a), len(a) + len(b))
        assert not damages[0].tail


def test_flipped_byte_in_last_batch_is_a_tail() -> None:
    a, b = _batch(1), _batch(2)
    bad = bytearray(b)
    bad[len(b) - len(TRAILER) - 3] ^= 0x20  # in the body
    items = list(scan(a + bytes(bad)))
    assert isinstance(items[0], Frame)
    assert items[1] == Damage(len(a), len(a) + len(b), "checksum mismatch", tail=True)


def test_payload_lookalike_header_does_not_resync() -> None:
    # A corrupt batch whose payload holds a frame-like line: resync must skip to a real frame.
    inner = _batch(9).decode()
    fake = encode_batch(2, "c-t", ["x"], [inner.replace("\n", " ")], create_ms=1, dt_ms=1).record
    bad = bytearray(fake)
    bad[-len(TRAILER) - 2] ^= 0x01
    items = list(scan(_batch(1) + bytes(bad) + _batch(3)))
    assert [i.seq for i in items if isinstance(i, Frame)] == [1, 3]


def test_garbage_header() -> None:
    assert parse_frame(b"hello\n", 0) == "bad header"
    assert parse_frame(b"#:Batch seq=x\n", 0) == "bad header"
    assert parse_frame(b"#:Bat", 0) == INCOMPLETE
    assert parse_frame(b"#:Batch " + b"9" * 300, 0) == "bad header"


def test_read_point_records() -> None:
    rp1, rp2 = ReadPoint(3, 120, 9), ReadPoint(4, 0, 12)
    data = _encode(rp1) + _encode(rp2)
    assert parse_read_point_file(data) == rp2
    assert parse_read_point_file(data[:-1]) == rp1  # torn last record
    assert parse_read_point_file(data.replace(b"4 0 12", b"4 0 13")) == rp1  # bad crc
    assert parse_read_point_file(b"") is None
    assert parse_read_point_file(b"garbage\n") is None

"""Request parsing of the add route: payload lines, limits, delay and dt."""

from __future__ import annotations

import pytest

from queue_daemon.api.errors import ApiError
from queue_daemon.api.web import parse_when, split_payloads
from queue_daemon.domain.names import valid_client, valid_type
from queue_daemon.engine.admit.ids import IdGenerator

LIMIT = 1 << 20


def kind_of(body: bytes, content_type: str = "text/plain", limit: int = LIMIT) -> tuple[int, str]:
    with pytest.raises(ApiError) as info:
        split_payloads(body, content_type, limit)
    return info.value.status, info.value.kind


def test_text_lines_with_and_without_final_newline() -> None:
    assert split_payloads(b"a\nb|c\n", "text/plain", LIMIT) == ["a", "b|c"]
    assert split_payloads(b"a\nb", "text/plain", LIMIT) == ["a", "b"]
    assert split_payloads(b"a\r\nb\r\n", "text/plain", LIMIT) == ["a", "b"]
    assert split_payloads("#:Batch x\né".encode(), "", LIMIT) == ["#:Batch x", "é"]


@pytest.mark.parametrize("body", [b"", b"\n", b"a\n\nb", b"\na", b"a\n\n"])
def test_empty_lines_are_rejected(body: bytes) -> None:
    assert kind_of(body) == (400, "bad_payload")


def test_invalid_utf8_and_nul_are_rejected() -> None:
    assert kind_of(b"ok\n\xff\xfe") == (400, "bad_payload")
    assert kind_of(b"a\x00b") == (400, "bad_payload")


def test_json_array_elements_become_compact_lines() -> None:
    body = b'[{"a": 1, "b": [1, 2]}, "x\\ny", 3, null]'
    lines = split_payloads(body, "application/json", LIMIT)
    assert lines == ['{"a":1,"b":[1,2]}', '"x\\ny"', "3", "null"]
    assert all("\n" not in line for line in lines)


@pytest.mark.parametrize("body", [b"{", b'{"a": 1}', b"[]", b"\xff"])
def test_bad_json_is_rejected(body: bytes) -> None:
    assert kind_of(body, "application/json") == (400, "bad_payload")


def test_payload_limit_is_in_bytes() -> None:
    assert split_payloads(b"x" * 10 + b"\n" + b"y" * 10, "text/plain", 10) == ["x" * 10, "y" * 10]
    assert kind_of(b"x" * 11, limit=10) == (413, "too_large")
    # four-byte characters count as four bytes
    assert kind_of("😀".encode() * 3, limit=10) == (413, "too_large")


def test_parse_when() -> None:
    now = 1_700_000_000_000
    assert parse_when({}, now) == now
    assert parse_when({"delay": "1.5"}, now) == now + 1500
    assert parse_when({"dt": "1700000005000"}, now) == 1_700_000_005_000
    assert parse_when({"dt": "2023-11-14T22:13:25Z"}, now) == 1_700_000_005_000
    assert parse_when({"dt": "2023-11-14T22:13:25+00:00"}, now) == 1_700_000_005_000
    for bad in (
        {"delay": "-1"},
        {"delay": "abc"},
        {"delay": "nan"},
        {"delay": "inf"},
        {"dt": "yesterday"},
        {"delay": "1", "dt": "1"},
        {"delay": "1e12"},
    ):
        with pytest.raises(ApiError) as info:
            parse_when(bad, now)
        assert (info.value.status, info.value.kind) == (400, "bad_request")


def test_ids_are_unique_and_ordered() -> None:
    gen = IdGenerator("7")
    ids = gen.next_ids(1000) + gen.next_ids(1) + gen.next_ids(500)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(i.endswith("-7") and "|" not in i for i in ids)
    # within one call the counter is consecutive, across the 4096-id blocks too
    for n in (1, 7, 8, 4097, 9000):
        batch = gen.next_ids(n)
        counters = [int(i.split("-")[0], 16) for i in batch]
        assert counters == list(range(counters[0], counters[0] + n))
        assert all(len(i.split("-")[0]) == 13 for i in batch)


def test_names() -> None:
    assert valid_client("a_1") and not valid_client("A") and not valid_client("a-b")
    assert not valid_client("a" * 41) and valid_client("a" * 40)
    assert valid_type("Resize.v2:x-y") and not valid_type("a|b") and not valid_type("a b")
    assert not valid_type("a" * 101) and not valid_type("a/b") and not valid_type("a,b")


def test_json_integers_beyond_64_bits_keep_their_value() -> None:
    body = b'[123456789012345678901234567890, {"n": -99999999999999999999}, 1.5]'
    lines = split_payloads(body, "application/json", LIMIT)
    assert lines == ["123456789012345678901234567890", '{"n":-99999999999999999999}', "1.5"]


@pytest.mark.parametrize(
    "body",
    [
        b'["\\ud800"]',
        b"[NaN]",
        b"[1, Infinity]",
        b"[" * 100_000 + b"]" * 100_000,
        b'[12345678901234567890, "\\udfff"]',
    ],
)
def test_json_that_cannot_be_stored_is_rejected(body: bytes) -> None:
    assert kind_of(body, "application/json") == (400, "bad_payload")

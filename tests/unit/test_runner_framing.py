"""Frames of runners/PROTOCOL.md survive any payload and any way the bytes arrive."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from queue_daemon.runners import framing
from queue_daemon.runners.errors import FrameTooLarge, ProtocolError

ODD: list[dict[str, Any]] = [
    {"op": "result", "id": "1", "output": '\x00\x01\x7f\r\n\t\\"', "result": None},
    {"op": "batch", "jobs": [{"id": "a", "payload": "ünïcødé ✓ 𝄞 \u2028 \ufeff", "attempt": 1}]},
    {"op": "start", "id": "x" * 1000},
    {"op": "x", "nested": [[[]], {"a": {"b": [1, 2.5, True, None]}}], "big": 2**62},
    {},
]


def test_round_trip_odd_messages() -> None:
    for message in ODD:
        frame = framing.encode(message)
        assert frame[:4] == len(frame[4:]).to_bytes(4, "big")
        assert framing.decode(frame[4:]) == message


def test_round_trip_huge_payload() -> None:
    message = {"op": "result", "output": "\x00é" * (4 << 20)}
    frame = framing.encode(message)
    messages, rest = framing.split(frame + frame[:7])
    assert messages == [message]
    assert rest == frame[:7]


def test_encode_refuses_over_64_mib() -> None:
    with pytest.raises(FrameTooLarge):
        framing.encode({"output": "x" * (framing.MAX_FRAME + 1)})


def test_split_refuses_oversized_announcement() -> None:
    with pytest.raises(FrameTooLarge):
        framing.split((framing.MAX_FRAME + 1).to_bytes(4, "big") + b"{}")


@pytest.mark.parametrize("body", [b"[1]", b"nope", b"\xff\xfe", b'"s"'])
def test_decode_wants_a_json_object(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        framing.decode(body)


async def feed_in_pieces(data: bytes, piece: int) -> list[dict[str, object]]:
    stream = asyncio.StreamReader()
    for i in range(0, len(data), piece):
        stream.feed_data(data[i : i + piece])
    stream.feed_eof()
    reader = framing.FrameReader(stream)
    out = []
    while (message := await reader.read()) is not None:
        out.append(message)
    return out


@pytest.mark.parametrize("piece", [1, 3, 4, 5, 7, 4096, 1 << 20])
async def test_reader_any_split(piece: int) -> None:
    data = b"".join(framing.encode(m) for m in ODD)
    assert await feed_in_pieces(data, piece) == ODD


async def test_reader_big_frame_in_small_reads() -> None:
    message = {"payload": "y" * (20 << 20)}
    assert await feed_in_pieces(framing.encode(message) * 2, 1 << 16) == [message, message]


async def test_reader_torn_frame_is_a_protocol_error() -> None:
    frame = framing.encode({"op": "done"})
    for cut in (1, 3, 5, len(frame) - 1):
        with pytest.raises(ProtocolError):
            await feed_in_pieces(frame + frame[:cut], 2)


async def test_read_frame_function() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(framing.encode({"op": "ready"}) + b"\x00\x00")
    stream.feed_eof()
    assert await framing.read_frame(stream) == {"op": "ready"}
    with pytest.raises(ProtocolError):
        await framing.read_frame(stream)


def test_orjson_and_json_agree_on_escapes() -> None:
    # the python bootstrap writes with json (ensure_ascii=False); the daemon reads with orjson
    import json

    text = "".join(chr(c) for c in range(0, 0x3000, 7)) + "\U0001f600"
    encoded = json.dumps({"s": text}, ensure_ascii=False, separators=(",", ":")).encode()
    assert orjson.loads(encoded) == {"s": text}

"""An add's options as the journal carries them (``JobOptions.encode`` and
``parse``): every option survives the round trip, a key of any printable
characters too; parts a line cannot mean are dropped, never raised."""

from __future__ import annotations

import pytest

from queue_daemon.domain.options import NO_OPTIONS, JobOptions, valid_key
from queue_daemon.observe.tracing import valid_traceparent

TRACE = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


@pytest.mark.parametrize(
    "options",
    [
        JobOptions(after=("a-1", "b-2"), resolve_any=True),
        JobOptions(deadline_ms=1_800_000_000_000, priority=-7),
        JobOptions(key="account-42"),
        JobOptions(key="a;b|c=d,e k\u00e9y \u043a"),
        JobOptions(trace=TRACE),
        JobOptions(after=("x",), priority=100, key="k", trace=TRACE),
    ],
)
def test_options_survive_the_journal(options: JobOptions) -> None:
    text = options.encode()
    assert "|" not in text and "\n" not in text
    assert JobOptions.parse(text) == options
    assert options


def test_no_options_write_nothing() -> None:
    assert not NO_OPTIONS
    assert NO_OPTIONS.encode() == ""


@pytest.mark.parametrize(
    "part", ["kzz", "k", "kff", "k" + "00" * 3, "t00-short", "tgarbage", "t01-" + "a" * 32]
)
def test_parts_a_line_cannot_mean_are_dropped(part: str) -> None:
    assert JobOptions.parse(f"p5;{part}") == JobOptions(priority=5)


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("k", True),
        ("x" * 200, True),
        ("x" * 201, False),
        ("", False),
        ("tab\t", False),
        ("nul\x00", False),
        ("surrogate\ud800", False),
        ("\u00e9\u043a\u4e2d", True),
    ],
)
def test_a_key_is_1_to_200_printable_characters(key: str, ok: bool) -> None:
    assert valid_key(key) is ok


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        (TRACE, TRACE),
        (TRACE.upper(), TRACE),
        (" " + TRACE + " ", TRACE),
        ("00-" + "0" * 32 + "-" + "cd" * 8 + "-01", None),  # an all-zero trace id
        ("00-" + "ab" * 16 + "-" + "0" * 16 + "-01", None),  # an all-zero span id
        ("01-" + "ab" * 16 + "-" + "cd" * 8 + "-01", None),  # another version
        ("garbage", None),
        (None, None),
    ],
)
def test_a_traceparent_is_kept_only_when_valid(header: str | None, kept: str | None) -> None:
    assert valid_traceparent(header) == kept


def test_a_log_excerpt_is_the_last_lines_within_bounds() -> None:
    from queue_daemon.engine.releases import LOG_EXCERPT_CHARS, LOG_EXCERPT_LINES, log_excerpt

    lines = [f"line {n}" for n in range(50)]
    assert log_excerpt(lines).split("\n") == lines[-LOG_EXCERPT_LINES:]
    long = [f"{n}" + "x" * 1500 for n in range(5)]
    excerpt = log_excerpt(long)  # the newest kept whole, the oldest cut at its start
    assert len(excerpt) == LOG_EXCERPT_CHARS and excerpt == "\n".join(long)[-LOG_EXCERPT_CHARS:]
    assert excerpt.endswith("\n" + long[-1])
    assert log_excerpt(["ф" * 10_000]) == "ф" * LOG_EXCERPT_CHARS  # characters, not bytes

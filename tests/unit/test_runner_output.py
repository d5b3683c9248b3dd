"""Output lines (docs/api.md), exit-code classes and handler checks: pure functions."""

from __future__ import annotations

import random

import pytest

from queue_daemon.domain.outcomes import code_of
from queue_daemon.runners.check import check_handler
from queue_daemon.runners.codes import valid_exitcode
from queue_daemon.runners.models import JobInput
from queue_daemon.runners.output import (
    STATUS_TRIES,
    OutputLimits,
    Parsed,
    _FollowOns,
    _Log,
    _set_status,
    _status_of,
    clip,
    emit_problem,
    parse_output,
)
from queue_daemon.runners.results import job_result

LIMITS = OutputLimits()


def test_j_lines_become_emits_in_order() -> None:
    parsed = parse_output('J: resize|{"w":1}\nhello\nJ: a.b:c-d_e|x|y\r\n', LIMITS)
    assert parsed.emits == [("resize", '{"w":1}'), ("a.b:c-d_e", "x|y\r")]
    assert parsed.log == ["hello"]
    assert parsed.exitcode is None


def test_forged_tenant_prefix_is_just_a_type_name() -> None:
    # the daemon prefixes the job's own client: this names type "othertenant-x" of THIS tenant
    parsed = parse_output("J: othertenant-x|p", LIMITS)
    assert parsed.emits == [("othertenant-x", "p")]


@pytest.mark.parametrize(
    "line",
    [
        "J: bad type|p",
        "J: a/b|p",
        "J: |p",
        "J: " + "t" * 101 + "|p",
        "J: t,u|p",
        "J: nobar",
        "J: t|",
        "J: t|nul\x00",
    ],
)
def test_bad_j_lines_are_dropped_with_a_reason(line: str) -> None:
    parsed = parse_output(line, LIMITS)
    assert parsed.emits == []
    assert len(parsed.log) == 1
    assert parsed.log[0].startswith("dropped a follow-on job: ")


def test_payload_over_the_limit_is_dropped() -> None:
    limits = OutputLimits(payload_limit=10)
    parsed = parse_output("J: t|0123456789\nJ: t|0123456789a\nJ: t|ééééé\nJ: t|éééééé", limits)
    assert parsed.emits == [("t", "0123456789"), ("t", "ééééé")]
    assert [line for line in parsed.log if "over the limit" in line] == [
        "dropped a follow-on job: payload of 11 bytes is over the limit of 10",
        "dropped a follow-on job: payload of 12 bytes is over the limit of 10",
    ]


def test_ctx_emits_are_validated_and_come_first() -> None:
    parsed = parse_output("J: b|2", LIMITS, emits=[("a", "1"), ("bad type", "x"), (3, "y")])
    assert parsed.emits == [("a", "1"), ("b", "2")]
    assert len(parsed.log) == 2


def test_emit_count_is_bounded() -> None:
    limits = OutputLimits(max_emits=3)
    parsed = parse_output("\n".join(f"J: t|{i}" for i in range(10)), limits)
    assert len(parsed.emits) == 3
    assert parsed.log == ["dropped 7 follow-on jobs over the limit of 3"]


def test_status_lines() -> None:
    parsed = parse_output("S: 404 not found here\nS: 201", LIMITS)
    assert (parsed.exitcode, parsed.result, parsed.result_set) == (201, "not found here", True)
    parsed = parse_output("S: 503\r\n", LIMITS)
    assert (parsed.exitcode, parsed.result_set) == (503, False)


@pytest.mark.parametrize("line", ["S: abc", "S: 42", "S: 600 x", "S: ", "S: -200", "S: ٢٠٠"])
def test_bad_status_lines_are_logged(line: str) -> None:
    parsed = parse_output(line, LIMITS)
    assert parsed.exitcode is None
    assert parsed.log == [f"ignored a bad status line: {line}"]


def test_progress_lines_keep_the_last_valid_one_clamped() -> None:
    parsed = parse_output("P: 0.2 a\nP: 7 too far\nP: nan\nP: x y\nlog", LIMITS)
    assert parsed.progress == (1.0, "too far")
    assert parsed.log == ["log"]  # P: lines are not logged
    assert parse_output("P: -1\r\n", LIMITS).progress == (0.0, "")
    assert parse_output("P: 0.5 " + "m" * 500, LIMITS).progress == (0.5, "m" * 200)
    assert parse_output("no report", LIMITS).progress is None


def test_the_last_progress_line_counts_past_the_log_room() -> None:
    limits = OutputLimits(max_log_lines=2, max_emits=1)
    lines = ["P: 0.1 early"] + [f"line {n}" for n in range(5000)] + ["P: 0.9 late", "tail"]
    assert parse_output("\n".join(lines), limits).progress == (0.9, "late")


def test_plain_lines_are_log_lines_and_bounded_by_count() -> None:
    parsed = parse_output("\n".join(f"line {i}" for i in range(150)), LIMITS)
    assert parsed.log[:2] == ["line 0", "line 1"]
    assert len(parsed.log) == 101
    assert parsed.log[-1] == "… 50 more lines dropped"


def test_log_bounded_by_bytes_and_long_lines_cut() -> None:
    limits = OutputLimits(max_log_bytes=5000)
    parsed = parse_output("\n".join("x" * 3000 for _ in range(5)), limits)
    assert parsed.log[0] == "x" * 2000 + "…"
    assert len(parsed.log) == 3
    assert parsed.log[-1] == "… 3 more lines dropped"


def test_extra_log_lines_are_never_parsed() -> None:
    parsed = parse_output("", LIMITS, extra_log=["J: t|p", "S: 200"])
    assert parsed.emits == [] and parsed.exitcode is None
    assert parsed.log == ["J: t|p", "S: 200"]


def test_empty_lines_and_trailing_newline() -> None:
    assert parse_output("a\n\nb\n", LIMITS).log == ["a", "", "b"]
    assert parse_output("", LIMITS).log == []


def test_clip_on_character_boundary() -> None:
    assert clip("ééé", 5) == "éé"
    assert clip("abc", 3) == "abc"
    assert clip("x" * 100, 10) == "x" * 10


def test_emit_problem_accepts_good_ones() -> None:
    assert emit_problem("A-z_0.9:x", "{}", 100) is None


@pytest.mark.parametrize(
    ("exitcode", "code"),
    [
        (100, "retry"),
        (199, "retry"),
        (200, "ok"),
        (299, "ok"),
        (404, "failed"),
        (499, "failed"),
        (500, "error"),
        (599, "error"),
        (302, "error"),
        (0, "error"),
        (700, "error"),
        (-1, "error"),
    ],
)
def test_code_of(exitcode: int, code: str) -> None:
    assert code_of(exitcode) == code


def test_valid_exitcode() -> None:
    assert valid_exitcode(200) and valid_exitcode(599) and valid_exitcode(100)
    assert not valid_exitcode(True) and not valid_exitcode(99) and not valid_exitcode("200")


def test_check_python() -> None:
    assert check_handler("python", "def handler(p, ctx):\n    return p\n") is None
    assert check_handler("python", "def handler(p, ctx):\n    return (\n") == (
        "line 2: '(' was never closed"
    )
    assert check_handler("python", "x = 1\x00") is not None
    assert check_handler("python", "(" * 10_000) is not None
    assert check_handler("python", "pass", before="x = await y()") is None
    problem = check_handler("python", "pass", after_each="def (")
    assert problem is not None and problem.startswith("afterEach: line 1:")


def test_check_shell_http_and_unknown() -> None:
    assert check_handler("shell", "echo hi") is None
    assert check_handler("shell", "  ") is not None
    assert check_handler("http", "https://example.com/hook?x=1") is None
    assert check_handler("http", "http://127.0.0.1:8080/") is None
    for bad in ("ftp://example.com/", "example.com", "http://", "http://a b/", "file:///etc"):
        assert check_handler("http", bad) is not None, bad
    problem = check_handler("cobol", "x")
    assert problem is not None and "unknown lang" in problem


def test_every_dropped_follow_on_job_keeps_its_reason() -> None:
    limits = OutputLimits(payload_limit=10)
    output = "J: ok|fine\nJ: a|b|c\nJ: nobar\nJ: t|\nJ: t|" + "x" * 11 + "\nJ: bad type|p\n"
    parsed = parse_output(output, limits, emits=[("e", "\ud800"), (None, "p"), ("e", "ok")])
    assert parsed.emits == [("e", "ok"), ("ok", "fine"), ("a", "b|c")]
    assert parsed.dropped == [
        "payload is not valid Unicode (a lone surrogate)",
        "bad type None",
        "no '|' in the J: line",
        "empty payload",
        "payload of 11 bytes is over the limit of 10",
        "bad type 'bad type'",
    ]
    assert parsed.log == [f"dropped a follow-on job: {reason}" for reason in parsed.dropped]


@pytest.mark.parametrize(
    "payload",
    [
        "#:Batch seq=1,date=2026-01-01T00:00:00.000Z,lines=1,bytes=9,crc=00000000",
        "#:EndBatch",
        "a|b|c|d",
        "\r",
        "tab\there",
    ],
)
def test_payloads_that_look_like_journal_framing_are_fine(payload: str) -> None:
    assert emit_problem("t", payload, 1 << 20) is None


# ---------------------------------------------------------------- floods of lines


def _one_at_a_time(output: str, limits: OutputLimits) -> Parsed:
    """The rule of parse_output, applied to every line in turn (the reference)."""
    parsed = Parsed()
    log = _Log(limits)
    follow = _FollowOns(parsed, log, limits)
    lines = output.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    for line in lines:
        if line.startswith("J: "):
            follow.add_line(line)
        elif line.startswith("S: "):
            status = _status_of(line)
            if status is None:
                log.add(f"ignored a bad status line: {line[:200]}")
            else:
                _set_status(parsed, status)
        else:
            log.add(line)
    if follow.over:
        log.add(f"dropped {follow.over} follow-on jobs over the limit of {limits.max_emits}")
    parsed.log = log.finish()
    return parsed


LINES = [
    "", "x", "plain text", "\r", "y" * 3000, "J: t|p", "J: t|ééé", "J: bad type|p",
    "J: nobar", "J: t|", "J: t|0123456789abc", "S: 200", "S: 404 not here", "S: 099 z",
    "S: 99", "S: abc", "S: 201 x\r", "S:200", "J:t|p",
]  # fmt: skip


def test_lines_searched_in_bulk_give_what_each_line_in_turn_gives() -> None:
    limits = OutputLimits(max_log_lines=5, max_log_bytes=4000, max_emits=3, payload_limit=10)
    rng = random.Random(16)
    for _ in range(2000):
        output = "\n".join(rng.choice(LINES) for _ in range(rng.randrange(100)))
        output += rng.choice(["", "\n"])
        got, want = parse_output(output, limits), _one_at_a_time(output, limits)
        assert (got.emits, got.dropped) == (want.emits, want.dropped), output
        assert (got.exitcode, got.result, got.result_set) == (
            want.exitcode,
            want.result,
            want.result_set,
        ), output
        # a bad status line past the log's room is not counted among the dropped lines
        kept = [line for line in got.log if not line.startswith("… ")]
        assert kept == [line for line in want.log if not line.startswith("… ")], output


def test_a_flood_of_lines_costs_no_step_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = 0
    add = _Log.add

    def counted(self: _Log, line: str) -> None:
        nonlocal steps
        steps += 1
        add(self, line)

    monkeypatch.setattr(_Log, "add", counted)
    output = "\n" * 1_000_000 + "J: t|late\n" + "x\n" * 1_000_000 + "S: 201 still read\n"
    parsed = parse_output(output, LIMITS)
    assert steps <= LIMITS.max_log_lines + 2
    assert parsed.emits == [("t", "late")]
    assert (parsed.exitcode, parsed.result) == (201, "still read")
    # (every line but the J: one is counted, the S: line too)
    assert parsed.log[-1] == f"… {2_000_001 - LIMITS.max_log_lines} more lines dropped"


def test_follow_on_lines_past_the_limit_are_counted_not_looked_at() -> None:
    limits = OutputLimits(max_emits=5)
    output = "J: t|x\n" * 10 + "J: nobar\n" * 1000 + "plain\n" + "J: t|y\n" * 1000
    parsed = parse_output(output, limits)
    assert parsed.emits == [("t", "x")] * 5
    assert parsed.dropped == []
    # past the most lines that could matter (here 210), plain lines are only counted
    # (and the note of the follow-on jobs over the limit after them)
    assert parsed.log == ["… 2 more lines dropped"]
    bad_first = parse_output("J: nobar\n" * 10 + "J: t|x\n" * 10, limits)
    assert (len(bad_first.dropped), bad_first.emits) == (5, [])
    assert bad_first.log[-1] == "dropped 15 follow-on jobs over the limit of 5"


def test_emits_past_what_is_looked_at_are_counted() -> None:
    limits = OutputLimits(max_emits=2)
    parsed = parse_output("", limits, [("t", "a"), ("t", "b"), ("t", "c")], more_emits=10)
    assert parsed.emits == [("t", "a"), ("t", "b")]
    assert parsed.log == ["dropped 11 follow-on jobs over the limit of 2"]


def test_the_last_good_status_line_is_found_among_the_last_bad_ones() -> None:
    flood = "x\n" * 500
    found = parse_output(flood + "S: 202 kept\n" + "S: 99\n" * (STATUS_TRIES - 1), LIMITS)
    assert (found.exitcode, found.result) == (202, "kept")
    hidden = parse_output(flood + "S: 202 kept\n" + "S: 99\n" * STATUS_TRIES, LIMITS)
    assert hidden.exitcode is None  # past what is looked at: as if it were not there


@pytest.mark.parametrize(
    ("ms", "expected"),
    [(2.5, 2.5), (0.0, 0.0), (-1.0, 7.0), (1e300, 7.0), (3, 7.0), ("2", 7.0), (True, 7.0),
     (None, 7.0)],
)  # fmt: skip
def test_a_run_takes_the_contexts_own_time_only_when_it_is_plausible(
    ms: object, expected: float
) -> None:
    # a context measures its runs itself (its results may come a group at a time);
    # what it sends is its tenant's to forge: anything but a sane float is ignored
    job = JobInput(id="j", payload="", attempt=1)
    message = {"op": "result", "id": "j", "exitcode": 200, "result": None, "ms": ms}
    assert job_result(job, message, 7.0, LIMITS).run_ms == expected

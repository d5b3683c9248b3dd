"""What a handler prints, read as lines (docs/api.md "Output lines"), with no step of
its own for a line that cannot change the outcome.

- ``J: <type>|<payload>`` adds a follow-on job. The type is a name of the job's
  own tenant: the daemon prefixes the job's client, so a line such as
  ``J: othertenant-x|p`` names this tenant's type ``othertenant-x``.
- ``S: <exitcode> [result]`` sets the exitcode (and the result, when given).
- ``P: <fraction> [message]`` reports progress (the last valid one counts).
- Anything else is a log line, bounded in count and bytes.

Pure functions: no I/O, unit-tested.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from queue_daemon.runners.codes import valid_exitcode

TYPE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
MAX_LINE_CHARS = 2000  # one log line longer than this is cut
MAX_PROGRESS_MESSAGE = 200  # characters of a P: line's message kept
STATUS_TRIES = 100  # S: lines past the log's room looked at, from the last, for a good one


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputLimits:
    max_log_lines: int = 100
    max_log_bytes: int = 64 << 10
    payload_limit: int = 1 << 20  # bytes of one follow-on payload
    max_emits: int = 10_000  # follow-on jobs per job
    result_limit: int = 1 << 20


@dataclass(slots=True, kw_only=True)
class Parsed:
    emits: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    exitcode: int | None = None  # from the last valid ``S:`` line
    result: str | None = None
    result_set: bool = False  # an ``S:`` line gave a result
    dropped: list[str] = field(default_factory=list)  # why each rejected follow-on job was
    progress: tuple[float, str] | None = None  # from the last valid ``P:`` line


def emit_problem(type_: object, payload: object, payload_limit: int) -> str | None:
    """Why a follow-on job cannot be added, or None when it is fine."""
    if not isinstance(type_, str) or TYPE_RE.fullmatch(type_) is None:
        shown = repr(type_)[:120] if not isinstance(type_, str) else repr(type_[:100])
        return f"bad type {shown}"
    if not isinstance(payload, str):
        return "payload is not a string"
    if not payload:
        return "empty payload"
    if "\n" in payload or "\x00" in payload:
        return "payload contains a newline or NUL"
    if payload.isascii():
        size = len(payload)
    else:
        try:
            size = len(payload.encode())
        except UnicodeEncodeError:
            return "payload is not valid Unicode (a lone surrogate)"
    if size > payload_limit:
        return f"payload of {size} bytes is over the limit of {payload_limit}"
    return None


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    if len(text) <= limit // 4:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


class _Log:
    """Log lines up to a line and byte budget; then a count of what was dropped."""

    __slots__ = ("bytes", "dropped", "limits", "lines")

    def __init__(self, limits: OutputLimits) -> None:
        self.limits = limits
        self.lines: list[str] = []
        self.bytes = 0
        self.dropped = 0

    @property
    def full(self) -> bool:
        """Whether every further line is only counted."""
        return self.dropped > 0

    def add(self, line: str) -> None:
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + "…"
        size = len(line.encode("utf-8", "surrogatepass")) + 1
        if (
            self.dropped
            or len(self.lines) >= self.limits.max_log_lines
            or self.bytes + size > self.limits.max_log_bytes
        ):
            self.dropped += 1
            return
        self.lines.append(line)
        self.bytes += size

    def finish(self) -> list[str]:
        if self.dropped:
            self.lines.append(f"… {self.dropped} more lines dropped")
            self.dropped = 0
        return self.lines


class _FollowOns:
    """A job's follow-on jobs as they are found: kept, or dropped with a reason, until
    ``max_emits`` are kept or as many dropped; past that only counted."""

    __slots__ = ("limits", "log", "over", "parsed")

    def __init__(self, parsed: Parsed, log: _Log, limits: OutputLimits) -> None:
        self.parsed = parsed
        self.log = log
        self.limits = limits
        self.over = 0

    @property
    def open(self) -> bool:
        """Whether one more is looked at (else it is only counted)."""
        most = self.limits.max_emits
        return len(self.parsed.emits) < most and len(self.parsed.dropped) < most

    def add(self, type_: object, payload: object) -> None:
        problem = emit_problem(type_, payload, self.limits.payload_limit)
        if problem is not None:
            self.drop(problem)
        else:
            assert isinstance(type_, str) and isinstance(payload, str)
            self.parsed.emits.append((type_, payload))

    def add_line(self, line: str) -> None:
        if not self.open:
            self.over += 1
            return
        type_, bar, payload = line[3:].partition("|")
        if bar:
            self.add(type_, payload)
        else:
            self.drop("no '|' in the J: line")

    def drop(self, problem: str) -> None:
        self.parsed.dropped.append(problem)
        self.log.add(f"dropped a follow-on job: {problem}")


def parse_output(
    output: str,
    limits: OutputLimits,
    emits: Sequence[tuple[object, object]] = (),
    extra_log: Iterable[str] = (),
    *,
    more_emits: int = 0,
) -> Parsed:
    """Follow-on jobs, status and log lines of one job.

    ``emits`` are the job's ``ctx.emit`` calls (validated like ``J:`` lines and
    placed before them; ``more_emits`` calls past them were not even passed,
    and count as over the limit); ``extra_log`` lines (e.g. a shell job's
    stderr) are logged after the output's own lines, never parsed as
    ``J:``/``S:``.

    A handler can print millions of lines in a second (16 MiB of them at
    most), so no line costs a step of its own unless it can still change the
    outcome: lines are taken one at a time until the log is full, and at most
    as many as the limits could keep (``max_log_lines`` + twice ``max_emits`` +
    ``STATUS_TRIES``); the rest is searched in bulk (``_in_bulk``).
    """
    parsed = Parsed()
    log = _Log(limits)
    follow = _FollowOns(parsed, log, limits)
    follow.over = more_emits
    for i, (type_, payload) in enumerate(emits):
        if not follow.open:
            follow.over += len(emits) - i
            break
        follow.add(type_, payload)
    at = _line_by_line(output, parsed, log, follow)
    if at < len(output):
        _in_bulk(output, at, parsed, log, follow)
        last = output.rfind("\nP: ", at - 1)  # the last report, past the lines taken
        if last >= 0:
            stop = output.find("\n", last + 1)
            line = output[last + 1 : stop if stop >= 0 else len(output)]
            parsed.progress = progress_line(line) or parsed.progress
    if follow.over:
        log.add(f"dropped {follow.over} follow-on jobs over the limit of {limits.max_emits}")
    for line in extra_log:
        log.add(line)
    parsed.log = log.finish()
    if parsed.result is not None:
        parsed.result = clip(parsed.result, limits.result_limit)
    return parsed


def _line_by_line(output: str, parsed: Parsed, log: _Log, follow: _FollowOns) -> int:
    """Takes the lines one at a time while the log has room (and at most as many as
    the limits could keep); where the lines left begin."""
    limits = log.limits
    steps = limits.max_log_lines + 2 * limits.max_emits + STATUS_TRIES
    at, end = 0, len(output)
    while at < end and steps > 0 and not log.full:
        stop = output.find("\n", at)
        if stop < 0:
            stop = end
        line = output[at:stop]
        at = stop + 1
        steps -= 1
        if line.startswith("J: "):
            follow.add_line(line)
        elif line.startswith("S: "):
            status = _status_of(line)
            if status is None:
                log.add(f"ignored a bad status line: {line[:200]}")
            else:
                _set_status(parsed, status)
        elif line.startswith("P: "):
            parsed.progress = progress_line(line) or parsed.progress
        else:
            log.add(line)
    return min(at, end)


def progress_line(line: str) -> tuple[float, str] | None:
    """The fraction (0 to 1) and message of a ``P: <fraction> [message]`` line;
    None if the fraction is not a number."""
    fraction_text, _, message = line[3:].rstrip("\r").lstrip(" ").partition(" ")
    try:
        fraction = float(fraction_text)
    except ValueError:
        return None
    if not math.isfinite(fraction):
        return None
    return min(1.0, max(0.0, fraction)), message[:MAX_PROGRESS_MESSAGE]


def _in_bulk(output: str, at: int, parsed: Parsed, log: _Log, follow: _FollowOns) -> None:
    """The lines from ``at`` on (``at`` > 0, just after a newline), with no step per line
    but for the ``J:`` lines that may still add a follow-on job and the ``S:`` lines
    looked at from the end. Every line but the ``J:`` ones counts as a dropped line."""
    # Each search is a pass over up to 16 MiB in C: none is made twice, and the
    # one for "\nJ: " (some 40 ms where every character is a newline) only where
    # there is a "J" at all (memchr: a millisecond).
    start = output.find("\nJ: ", at - 1) if output.find("J", at) >= 0 else -1
    jobs = 0 if start < 0 else output.count("\nJ: ", start)
    log.dropped += output.count("\n", at) + (not output.endswith("\n")) - jobs
    seen = 0
    while start >= 0 and follow.open:
        stop = output.find("\n", start + 1)
        follow.add_line(output[start + 1 : stop if stop >= 0 else len(output)])
        seen += 1
        start = output.find("\nJ: ", stop) if stop >= 0 else -1
    follow.over += jobs - seen
    # the exit code of the last good S: line, the result of the last one with a result
    start, code = output.rfind("\nS: ", at - 1), None
    for _ in range(STATUS_TRIES):
        if start < 0:
            break
        stop = output.find("\n", start + 1)
        status = _status_of(output[start + 1 : stop if stop >= 0 else len(output)])
        if status is not None:
            code = status[0] if code is None else code
            if status[1]:
                _set_status(parsed, (code, status[1]))
                return
        start = output.rfind("\nS: ", at - 1, start)
    if code is not None:
        parsed.exitcode = code


def _status_of(line: str) -> tuple[int, str] | None:
    """The exit code and result (maybe empty) of an ``S:`` line; None if it is bad."""
    code_text, _, result = line[3:].rstrip("\r").lstrip(" ").partition(" ")
    code = int(code_text) if code_text.isascii() and code_text.isdigit() else None
    if code is None or not valid_exitcode(code):
        return None
    return code, result


def _set_status(parsed: Parsed, status: tuple[int, str]) -> None:
    parsed.exitcode, result = status
    if result:
        parsed.result = result
        parsed.result_set = True

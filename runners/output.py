"""What a handler prints, read line by line (docs/api.md "Output lines").

- ``J: <type>|<payload>`` adds a follow-on job. The type is a name of the job's
  own tenant: the daemon prefixes the job's client, so a line such as
  ``J: othertenant-x|p`` names this tenant's type ``othertenant-x``.
- ``S: <exitcode> [result]`` sets the exitcode (and the result, when given).
- Anything else is a log line, bounded in count and bytes.

Pure functions: no I/O, unit-tested.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from runners.codes import valid_exitcode

TYPE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
MAX_LINE_CHARS = 2000  # one log line longer than this is cut


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputLimits:
    max_log_lines: int = 100
    max_log_bytes: int = 64 << 10
    payload_limit: int = 1 << 20  # bytes of one follow-on payload
    max_emits: int = 10_000  # follow-on jobs per job
    max_result_bytes: int = 1 << 20


@dataclass(slots=True, kw_only=True)
class Parsed:
    emits: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    exitcode: int | None = None  # from the last valid ``S:`` line
    result: str | None = None
    result_set: bool = False  # an ``S:`` line gave a result
    dropped: list[str] = field(default_factory=list)  # why each rejected follow-on job was


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


def parse_output(
    output: str,
    limits: OutputLimits,
    emits: Iterable[tuple[object, object]] = (),
    extra_log: Iterable[str] = (),
) -> Parsed:
    """Follow-on jobs, status and log lines of one job.

    ``emits`` are the job's ``ctx.emit`` calls (validated like ``J:`` lines and
    placed before them); ``extra_log`` lines (e.g. a shell job's stderr) are
    logged after the output's own lines, never parsed as ``J:``/``S:``.
    """
    parsed = Parsed()
    log = _Log(limits)
    over = 0

    def add_emit(type_: object, payload: object) -> None:
        nonlocal over
        problem = emit_problem(type_, payload, limits.payload_limit)
        if problem is not None:
            parsed.dropped.append(problem)
            log.add(f"dropped a follow-on job: {problem}")
        elif len(parsed.emits) >= limits.max_emits:
            over += 1
        else:
            assert isinstance(type_, str) and isinstance(payload, str)
            parsed.emits.append((type_, payload))

    for pair in emits:
        type_, payload = pair
        add_emit(type_, payload)
    lines = output.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    for line in lines:
        if line.startswith("J: "):
            type_, bar, payload = line[3:].partition("|")
            if not bar:
                parsed.dropped.append("no '|' in the J: line")
                log.add("dropped a follow-on job: no '|' in the J: line")
            else:
                add_emit(type_, payload)
        elif line.startswith("S: "):
            _status(line, parsed, log)
        else:
            log.add(line)
    if over:
        log.add(f"dropped {over} follow-on jobs over the limit of {limits.max_emits}")
    for line in extra_log:
        log.add(line)
    parsed.log = log.finish()
    if parsed.result is not None:
        parsed.result = clip(parsed.result, limits.max_result_bytes)
    return parsed


def _status(line: str, parsed: Parsed, log: _Log) -> None:
    code_text, _, result = line[3:].rstrip("\r").lstrip(" ").partition(" ")
    code = int(code_text) if code_text.isascii() and code_text.isdigit() else None
    if code is None or not valid_exitcode(code):
        log.add(f"ignored a bad status line: {line[:200]}")
        return
    parsed.exitcode = code
    if result:
        parsed.result = result
        parsed.result_set = True

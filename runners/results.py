"""A job's result as the daemon keeps it: from a context's reply, or for a job that
failed or never ran."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from queue_daemon.runners.codes import ERROR, NOT_RUN, valid_exitcode
from queue_daemon.runners.models import JobInput, JobResult
from queue_daemon.runners.output import OutputLimits, clip, parse_output

MAX_RUN_MS = 1e10  # a context's measure of a run is taken up to this (about 116 days)


def job_result(
    job: JobInput, message: dict[str, Any], run_ms: float, limits: OutputLimits
) -> JobResult:
    """A job's result from its context's reply: exit code, result, output lines
    (follow-on jobs, status lines, log). ``recycle`` in the reply (e.g. after a
    MemoryError) marks the result ``recycle``: the context may be in a bad state.
    The run's time is the context's own measure (``ms``) where it gives one (its
    results may come a group at a time), else ``run_ms``, the daemon's."""
    ms = message.get("ms")
    if type(ms) is float and 0.0 <= ms <= MAX_RUN_MS:
        run_ms = ms
    exitcode = message.get("exitcode")
    result = message.get("result")
    output = message.get("output")
    emits = message.get("emits")
    over = message.get("emit_over")
    if (
        not output
        and not emits
        and not over
        and valid_exitcode(exitcode)
        and (result is None or isinstance(result, str))
        and "recycle" not in message
    ):  # the common case, quickly
        if result is not None:
            result = clip(result, limits.result_limit)
        return JobResult(id=job.id, exitcode=exitcode, result=result, run_ms=run_ms)
    pairs: list[tuple[object, object]] = []
    more = 0
    if isinstance(emits, list):
        # parse_output looks at no more than this: a context may send millions
        read = emits[: 2 * limits.max_emits]
        more = len(emits) - len(read)
        for emit in read:
            ok = isinstance(emit, list) and len(emit) == 2
            pairs.append((emit[0], emit[1]) if ok else (None, None))
    text = output if isinstance(output, str) else ""
    parsed = parse_output(text, limits, pairs, more_emits=more)
    if not valid_exitcode(exitcode):
        result = f"invalid exit code {clip(repr(exitcode), 100)}"
        exitcode = ERROR
    elif result is not None and not isinstance(result, str):
        result = orjson.dumps(result).decode()
    if parsed.exitcode is not None:
        exitcode = parsed.exitcode
        if parsed.result_set:
            result = parsed.result
    assert isinstance(exitcode, int)
    return JobResult(
        id=job.id,
        exitcode=exitcode,
        result=None if result is None else clip(result, limits.result_limit),
        emits=parsed.emits,
        log=parsed.log,
        dropped=parsed.dropped,
        emit_over=_count(over),
        emit_short=min(_count(message.get("emit_short")), _count(over)),
        emit_cost=_count(message.get("emit_cost")),
        run_ms=run_ms,
        recycle=bool(message.get("recycle")),
        progress=parsed.progress,
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def failed(job: JobInput, exitcode: int, reason: str) -> JobResult:
    return JobResult(id=job.id, exitcode=exitcode, result=reason)


def not_run(job: JobInput, reason: str) -> JobResult:
    return JobResult(id=job.id, exitcode=NOT_RUN, result=f"not started: {reason}", ran=False)


def stopped(
    jobs: Sequence[JobInput],
    results: list[JobResult],
    running: JobInput | None,
    started: int,
    code: int,
    reason: str,
    *,
    timed_out: bool,
) -> list[JobResult]:
    """Every job's result once a context stopped in the middle of a batch: the
    ``results`` it gave, ``running`` failed, the rest not run; ``started`` jobs
    had begun."""
    if not results and running is None and started == 0:
        # stopped before the first job: beforeEach hung or crashed; count it as a run
        # of every job, so a broken hook cannot requeue the batch for ever
        where = "beforeEach " + reason if timed_out else reason
        return [failed(job, code, where) for job in jobs]
    out = list(results)
    if running is not None:
        out.append(failed(running, code, reason))
    out += [not_run(job, f"an earlier job of the batch: {reason}") for job in jobs[len(out) :]]
    return out

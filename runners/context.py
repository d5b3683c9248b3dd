"""A context: one sandboxed child running a language bootstrap for one handler version.

The daemon side of runners/PROTOCOL.md. The protocol pipes are the child's
fds 3 and 4; the process itself, its directory and the drain of its output
are ``runners.child``'s.

Per-job timeouts need no task per frame: one timer a batch (``runners.deadline``).

What a job starts in the background lives on after the job returns, while its
context stays warm (it is the same tenant's, under the same limits), and is
killed with the context: with a cgroup (``queue_daemon.runners.sandbox.cgroups``) even if it left
the process group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from queue_daemon.runners import framing
from queue_daemon.runners.budget import Spend, no_limit
from queue_daemon.runners.child import ContextChild
from queue_daemon.runners.codes import ERROR, TIMEOUT
from queue_daemon.runners.deadline import JobDeadline
from queue_daemon.runners.errors import ContextFailed, ProtocolError
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import OutputLimits
from queue_daemon.runners.results import job_result, not_run, stopped
from queue_daemon.runners.sandbox import Sandbox

logger = logging.getLogger(__name__)


def seconds(value: float) -> str:
    return f"{value:g}s"


class Context:
    """One child for one handler version (``spec.context_key``), reused batch after batch."""

    def __init__(
        self,
        spec: HandlerSpec,
        *,
        sandbox: Sandbox,
        command: list[str],
        limits: OutputLimits,
        start_timeout: float,
        memory: str = "as",
        spend: Spend = no_limit,
    ) -> None:
        self.spec = spec  # the first handler it loaded
        self.key = spec.context_key
        self.loaded: dict[str, str] = {}  # type -> handler version (several: an eid's)
        self.jobs_run = 0
        self.last_used = time.monotonic()
        self.broken = False  # died, timed out or asked to be recycled: never reused
        self.retired = False  # a newer handler version exists: close after this batch
        self.successor = False  # the pool is already starting this context's replacement
        self._child = ContextChild(sandbox, spec.client, spend)
        self._command = command
        self._memory = memory
        self._limits = limits
        self._spend = spend  # the tenant's output budget (runners.budget)
        self._start_timeout = start_timeout
        self._reader: framing.FrameReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_transport: asyncio.ReadTransport | None = None
        self._closed = False
        self._clock = JobDeadline(self._child.kill_tree)

    @property
    def pid(self) -> int | None:
        proc = self._child.proc
        return proc.pid if proc is not None else None

    @property
    def home(self) -> Path | None:
        return self._child.home

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        return (
            not self._closed
            and not self.broken
            and self._child.proc is not None
            and self._child.proc.returncode is None
        )

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        """Spawn the child and load the handler; ContextFailed (already cleaned up) if it cannot."""
        try:
            self._reader, self._writer, self._read_transport = await self._child.spawn(
                self._command, self._memory, self.spec.lang
            )
            await self._load(self.spec)
        except BaseException:
            self.broken = True
            await self.close()
            raise

    async def load(self, spec: HandlerSpec) -> None:
        """Load another handler of the context's eid; ContextFailed (and the context
        broken) if it does not load."""
        try:
            await self._load(spec)
        except BaseException:
            self.broken = True
            raise

    async def _load(self, spec: HandlerSpec) -> None:
        assert self._writer is not None and self._reader is not None
        try:
            init = framing.encode(
                {
                    "op": "init",
                    "lang": spec.lang,
                    "body": spec.body,
                    "before": spec.before,
                    "beforeEach": spec.before_each,
                    "afterEach": spec.after_each,
                    "type": spec.type,
                    "client": spec.client,
                }
            )
        except ProtocolError as exc:  # a handler too big for one frame
            raise ContextFailed(f"the handler cannot be sent to its context: {exc}") from None
        self._writer.write(init)
        try:
            async with asyncio.timeout(self._start_timeout):
                await self._writer.drain()
                message = await self._reader.read()
        except TimeoutError:
            raise ContextFailed(
                f"the handler did not load within {seconds(self._start_timeout)}"
            ) from None
        except ProtocolError as exc:
            raise ContextFailed(f"the context broke the protocol while starting: {exc}") from None
        except ConnectionError:
            message = None
        if message is None:
            raise ContextFailed(await self._child.death("the context died while starting"))
        op = message.get("op")
        if op == "fatal":
            raise ContextFailed(str(message.get("message") or "the handler failed to load"))
        if op != "ready":
            raise ContextFailed(f"the context sent {op!r} instead of ready")
        self.loaded[spec.type] = spec.version

    # ------------------------------------------------------------------ batches

    async def run_batch(
        self,
        jobs: Sequence[JobInput],
        timeout_per_job: float,
        sink: ResultSink | None = None,
        type: str | None = None,
    ) -> list[JobResult]:
        """Every job's result, in order. Never raises for what the child does: a crash,
        a timeout or a protocol error ends the running job as 500/504 and the jobs
        not yet started as ``ran=False``, and marks the context ``broken``.
        """
        results: list[JobResult] = []
        limit = None if sink is None else sink.emit_limit()
        budget = None if sink is None else sink.emit_budget()
        for frame, chunk in framing.batch_frames(jobs, limit, type or self.spec.type, budget):
            if self.broken:
                results += [not_run(job, "the context stopped on an earlier job") for job in chunk]
                continue
            results += await self._run_chunk(frame, chunk, timeout_per_job, sink)
        self.jobs_run += len(jobs)
        self.last_used = time.monotonic()
        return results

    async def _run_chunk(
        self,
        frame: bytes,
        jobs: Sequence[JobInput],
        timeout_per_job: float,
        sink: ResultSink | None,
    ) -> list[JobResult]:
        timeout = timeout_per_job
        assert self._writer is not None and self._reader is not None
        reader = self._reader
        loop = asyncio.get_running_loop()
        results: list[JobResult] = []
        running: JobInput | None = None
        implied = False  # running was started by its predecessor's result, not a start
        index = 0  # jobs started
        problem: str | None = None
        clock = self._clock
        clock.start(timeout)
        began = loop.time()  # of the running job (a job without a start: since the last result)
        reports = _Reports(sink, jobs, began)
        # once the pipe ends, the results the context held (read when called)
        reader.on_end = lambda: self._held_back(running, jobs, index)
        try:
            self._writer.write(frame)
            await self._writer.drain()
            while True:
                message = await reader.read()
                if message is None:
                    break
                op = message.get("op")
                job_id = message.get("id")
                if op == "progress":
                    # a report of one of the batch's jobs (its start may be held
                    # back): no step of the batch, so no move of its clock
                    reports.frame(job_id, message, loop.time())
                    continue
                if (
                    op == "result"
                    and running is None
                    and index < len(jobs)
                    and job_id == jobs[index].id
                ):  # a result without its start (e.g. every job failed in beforeEach)
                    running = jobs[index]
                    index += 1
                if op == "start":
                    if running is not None and job_id == running.id and implied:
                        began = loop.time()  # a later job's own start: its clock anew
                    elif running is not None or index >= len(jobs) or job_id != jobs[index].id:
                        raise ProtocolError(f"unexpected start of job {job_id!r}")
                    else:
                        running = jobs[index]
                        index += 1
                        began = loop.time()
                    implied = False
                elif op == "result":
                    if running is None or job_id != running.id:
                        raise ProtocolError(f"unexpected result of job {job_id!r}")
                    now = loop.time()
                    # the last report, when it was not sent on its own
                    reports.report(job_id, message.get("progress"))
                    result = job_result(running, message, (now - began) * 1000, self._limits)
                    printed = _length(message.get("output"))  # (the text itself is freed)
                    self.broken = self.broken or result.recycle  # e.g. after a MemoryError
                    results.append(result)
                    began = now
                    # the next job starts as this result is sent (PROTOCOL.md)
                    running = jobs[index] if index < len(jobs) else None
                    index += running is not None
                    implied = True
                    del message  # what the result does not hold (its output) is freed
                    taker = sink if sink is not None and sink.wants(result) else None
                    if printed or taker is not None:
                        results[-1] = await self._taken(result, taker, printed, timeout)
                elif op == "done":
                    if running is not None or index < len(jobs):
                        raise ProtocolError("done before every job had a result")
                    return results
                else:
                    raise ProtocolError(f"unexpected message {op!r}")
                clock.move(timeout)
        except ProtocolError as exc:
            problem = f"the context broke the protocol: {exc}"
        except ConnectionError:
            pass  # the child is gone: its pipe broke while we wrote the batch
        finally:
            clock.stop()
            reader.on_end = None
        return await self._failed(jobs, results, running, index, timeout_per_job, problem)

    async def _taken(
        self, result: JobResult, sink: ResultSink | None, printed: int, job_seconds: float
    ) -> JobResult:
        """``result`` as ``sink`` (one that wants it, if any) keeps it, and what it
        printed spent from the tenant's output budget: time the daemon takes, not
        the next job's."""
        if sink is not None:
            self._clock.move(job_seconds)
            result = await sink.take(result)
        if printed:
            await self._spend_outside_the_clock(printed, job_seconds)
        return result

    async def _held_back(
        self, running: JobInput | None, jobs: Sequence[JobInput], index: int
    ) -> list[dict[str, Any]]:
        """The results the context held and did not send before its pipe ended
        (runners.held), once it is stopped."""
        held = self._child.held
        if held is None or not held.anything():
            return []
        await self._child.stop()  # nothing is written to the file any more
        return held.read_back(running, jobs, index)

    async def _spend_outside_the_clock(self, size: int, job_seconds: float) -> None:
        """What a job printed, from the tenant's output budget: a wait that is not the
        next job's time (meanwhile the child's frames wait in its pipe)."""
        self._clock.pause()
        await self._spend(size)
        self._clock.resume(job_seconds)

    async def _failed(
        self,
        jobs: Sequence[JobInput],
        results: list[JobResult],
        running: JobInput | None,
        index: int,
        timeout_per_job: float,
        problem: str | None,
    ) -> list[JobResult]:
        """Results once the context stopped in the middle of a batch."""
        timeout = timeout_per_job
        self.broken = True
        timed_out = self._clock.timed_out
        if timed_out:
            reason = f"timed out after {seconds(timeout)}"
            code = TIMEOUT
            await self._child.stop()
        elif problem is not None:
            reason, code = problem, ERROR
            await self._child.stop()
        else:
            reason, code = await self._child.death("context died"), ERROR
        logger.warning(
            "%s context of %s-%s stopped: %s",
            self.spec.lang,
            self.spec.client,
            self.spec.type,
            reason,
            extra={"action": "context_failed", "tenant": self.spec.client, "pid": self.pid},
        )
        return stopped(jobs, results, running, index, code, reason, timed_out=timed_out)

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Ask the child to exit, kill its group after a grace period, reap it, remove its dir."""
        if self._closed:
            return
        self._closed = True
        await self._child.end(None if self.broken else self._writer)
        if self._writer is not None:
            self._writer.close()
        if self._read_transport is not None:
            self._read_transport.close()
        await self._child.clean()


def _length(text: object) -> int:
    return len(text) if isinstance(text, str) else 0


PROGRESS_BURST = 50  # progress frames a chunk may send at once,
PROGRESS_RATE = 20.0  # and then a second (a bootstrap sends at most 10 a second)
PROGRESS_MOST = 4096  # characters of a progress frame's message (200 are kept)


class _Reports:
    """A chunk's progress reports, to the batch's sink when they name one of its
    jobs. The bootstraps pace them; a context that does not (its handler writes
    frames of its own) is stopped as a broken one, so that no context can keep
    the daemon's loop decoding reports."""

    def __init__(self, sink: ResultSink | None, jobs: Sequence[JobInput], now: float) -> None:
        self._sink = sink
        self._jobs = jobs
        self._ids: set[str] | None = None
        self._began = now
        self._frames = 0

    def frame(self, job_id: object, message: dict[str, Any], now: float) -> None:
        """A ``progress`` frame."""
        self._frames += 1
        if self._frames > PROGRESS_BURST + PROGRESS_RATE * (now - self._began):
            raise ProtocolError(f"progress frames faster than {PROGRESS_RATE:g} a second")
        text = message.get("message")
        if isinstance(text, str) and len(text) > PROGRESS_MOST:
            raise ProtocolError(f"a progress message over {PROGRESS_MOST} characters")
        self.report(job_id, [message.get("fraction"), text])

    def report(self, job_id: object, report: object) -> None:
        """``[fraction, message]`` of a job (anything else is ignored)."""
        if self._sink is None or not isinstance(report, list) or len(report) != 2:
            return
        if self._ids is None:
            self._ids = {job.id for job in self._jobs}
        if job_id in self._ids:
            self._sink.progress(str(job_id), report[0], report[1])

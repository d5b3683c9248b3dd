"""A context: one sandboxed child running a language bootstrap for one handler version.

The daemon side of runners/PROTOCOL.md. The protocol pipes are the child's
fds 3 and 4; its stdout and stderr are drained all the time into rings of
recent lines (a full pipe would block the child), which explain a crash.

Per-job timeouts need no task per frame: one timer a batch (``runners.deadline``).

What a job starts in the background lives on after the job returns, while its
context stays warm (it is the same tenant's, under the same limits), and is
killed with the context: with a cgroup (``queue_daemon.runners.sandbox.cgroups``) even if it left
the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from queue_daemon.runners import framing, held
from queue_daemon.runners.budget import Spend, no_limit
from queue_daemon.runners.codes import ERROR, TIMEOUT
from queue_daemon.runners.deadline import JobDeadline
from queue_daemon.runners.errors import ContextFailed, ProtocolError
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import OutputLimits
from queue_daemon.runners.results import job_result, not_run, stopped
from queue_daemon.runners.ring import LineRing, drain
from queue_daemon.runners.sandbox import Child, Sandbox, describe_exit

logger = logging.getLogger(__name__)

STDERR_TAIL = 5  # lines of stderr quoted when a context dies
EXIT_GRACE = 1.0  # seconds a context gets to leave after ``exit``
DRAIN_GRACE = 1.0  # seconds to read what a dead context last wrote


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
        self.output = LineRing()  # the child's stdout and stderr (context-level, not a job's)
        self._sandbox = sandbox
        self._command = command
        self._memory = memory
        self._limits = limits
        self._spend = spend  # the tenant's output budget (runners.budget)
        self._start_timeout = start_timeout
        self._proc: Child | None = None
        self._home: Path | None = None
        self._held: int | None = None  # the held-results file (runners.held)
        self._reader: framing.FrameReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_transport: asyncio.ReadTransport | None = None
        self._drains: list[asyncio.Task[None]] = []
        self._closed = False
        self._clock = JobDeadline(self._kill_tree)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def home(self) -> Path | None:
        return self._home

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        return (
            not self._closed
            and not self.broken
            and self._proc is not None
            and self._proc.returncode is None
        )

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        """Spawn the child and load the handler; ContextFailed (already cleaned up) if it cannot."""
        try:
            await self._spawn()
            await self._load(self.spec)
        except BaseException:
            self.broken = True
            await self.close()
            raise

    async def _spawn(self) -> None:
        await self._sandbox.prepare()
        self._home = self._sandbox.make_dir(f"ctx-{self.spec.client}-", self.spec.client)
        owner = self._sandbox.owner(self.spec.client)
        self._held = held.create(self._home, None if owner is None else (owner.uid, owner.gid))
        to_child, to_daemon = os.pipe(), os.pipe()
        try:
            self._proc = await self._sandbox.spawn(
                self._command,
                client=self.spec.client,
                home=self._home,
                pipes=(to_child[0], to_daemon[1]),
                memory=self._memory,
            )
        except OSError as exc:
            for fd in (*to_child, *to_daemon):
                os.close(fd)
            raise ContextFailed(f"cannot start a {self.spec.lang} context: {exc}") from None
        os.close(to_child[0])
        os.close(to_daemon[1])
        self._reader, self._writer, self._read_transport = await framing.open_pipes(
            to_daemon[0], to_child[1]
        )
        proc = self._proc
        assert proc.stderr is not None
        self._drains = [
            asyncio.create_task(
                drain(proc.stderr, self.output, self._spend), name=f"ctx-{proc.pid}-output"
            )
        ]

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
        self._writer.write(
            framing.encode(
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
        )
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
            raise ContextFailed(await self._death("the context died while starting"))
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
        limit = None if sink is None else sink.emit_limit
        for frame, chunk in framing.batch_frames(jobs, limit, type or self.spec.type):
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
                    result = job_result(running, message, (now - began) * 1000, self._limits)
                    printed = _length(message.get("output"))  # (the text itself is freed)
                    self.broken = self.broken or result.recycle  # e.g. after a MemoryError
                    results.append(result)
                    began = now
                    # the next job starts as this result is sent (PROTOCOL.md)
                    running = jobs[index] if index < len(jobs) else None
                    index += running is not None
                    implied = True
                    if sink is not None:
                        del message  # what the result does not hold (its output) is freed
                        # the time the daemon takes is not the next job's
                        clock.move(timeout)
                        results[-1] = await sink.take(result)
                    if printed:
                        await self._spend_outside_the_clock(printed, timeout)
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

    async def _held_back(
        self, running: JobInput | None, jobs: Sequence[JobInput], index: int
    ) -> list[dict[str, Any]]:
        """The results the context held and did not send before its pipe ended
        (runners.held), once it is stopped."""
        if self._held is None or not held.anything_held(self._held):
            return []
        await self._stop()  # nothing is written to the file any more
        return held.read_back(self._held, running, jobs, index)

    async def _spend_outside_the_clock(self, size: int, job_seconds: float) -> None:
        """What a job printed, from the tenant's output budget: a wait that is not the
        next job's time (meanwhile the child's frames wait in its pipe)."""
        self._clock.pause()
        await self._spend(size)
        self._clock.resume(job_seconds)

    def _kill_tree(self) -> None:
        if self._proc is not None:
            self._proc.kill_tree()

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
            await self._stop()
        elif problem is not None:
            reason, code = problem, ERROR
            await self._stop()
        else:
            reason, code = await self._death("context died"), ERROR
        logger.warning(
            "%s context of %s-%s stopped: %s",
            self.spec.lang,
            self.spec.client,
            self.spec.type,
            reason,
            extra={"action": "context_failed", "tenant": self.spec.client, "pid": self.pid},
        )
        return stopped(jobs, results, running, index, code, reason, timed_out=timed_out)

    async def _stop(self) -> None:
        """Kill the whole tree and reap the child."""
        if self._proc is None:
            return
        self._proc.kill_tree()
        await self._proc.exited()

    async def _death(self, what: str) -> str:
        """Why the child died: its exit status and the last lines it wrote to stderr."""
        await self._stop()
        await self._finish_drains()
        assert self._proc is not None
        text = f"{what} ({describe_exit(self._proc.returncode)})"
        tail = [line for line in self.output.tail(STDERR_TAIL) if line.strip()]
        return f"{text}: " + " | ".join(tail) if tail else text

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Ask the child to exit, kill its group after a grace period, reap it, remove its dir."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        if proc is not None:
            if proc.returncode is None and self._writer is not None and not self.broken:
                with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
                    self._writer.write(framing.encode({"op": "exit"}))
                    await asyncio.wait_for(proc.exited(), EXIT_GRACE)
            proc.kill_tree()  # whatever it left behind in its group (and cgroup)
            await proc.exited()
            await self._sandbox.release(proc)
        if self._writer is not None:
            self._writer.close()
        if self._read_transport is not None:
            self._read_transport.close()
        await self._finish_drains()
        if proc is not None:
            proc.close()
        if self._held is not None:
            os.close(self._held)
            self._held = None
        if self._home is not None:
            await asyncio.to_thread(self._sandbox.remove_dir, self._home)

    async def _finish_drains(self) -> None:
        if not self._drains:
            return
        drains, self._drains = self._drains, []
        _, pending = await asyncio.wait(drains, timeout=DRAIN_GRACE)
        for task in pending:  # a process that left the group still holds the pipe
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in drains:
            if not task.cancelled() and task.exception() is not None:
                logger.warning("draining a context's output failed: %r", task.exception())


def _length(text: object) -> int:
    return len(text) if isinstance(text, str) else 0

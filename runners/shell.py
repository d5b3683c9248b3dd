"""Shell handlers: each job is ``/bin/sh -c <body>`` in the sandbox, its payload on stdin.

Exit status 0 is 200 and any other 500, unless the command printed an
``S: <exitcode> [result]`` line. The jobs of a batch share one private
directory and run a few at a time; each job's process group (and cgroup, see
``queue_daemon.runners.sandbox.cgroups``) is killed when its shell exits (nothing it started in the
background survives the job) or when its time is up (504).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Sequence
from pathlib import Path

from queue_daemon.runners.budget import OutputBudget
from queue_daemon.runners.codes import ERROR, OK, TIMEOUT
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import OutputLimits, parse_output
from queue_daemon.runners.ring import READ_SIZE, LineRing, drain, finish_reading
from queue_daemon.runners.sandbox import Sandbox, describe_exit

SHELL = "/bin/sh"
STDERR_LINES = 20  # last lines of a job's stderr kept as log lines
READ_GRACE = 1.0  # seconds to read what a finished job's pipes still hold
# The command travels in the environment, not in argv: every process's argv is
# readable by every user in /proc/<pid>/cmdline, its environment only by its own.
COMMAND_VARIABLE = "QUEUE_HANDLER_COMMAND"
# It leaves the environment before the command runs: the command sees the
# same environment as every handler.
RUN_COMMAND = f'__qd_command=${COMMAND_VARIABLE}; unset {COMMAND_VARIABLE}; eval "$__qd_command"'
MAX_STDOUT = 16 << 20  # bytes of a job's stdout parsed; the rest is counted and dropped


class ShellRunner:
    """Runs the jobs of shell handlers, ``concurrency`` processes at a time per batch."""

    def __init__(
        self,
        sandbox: Sandbox,
        limits: OutputLimits,
        *,
        concurrency: int = 4,
        budget: OutputBudget | None = None,
    ) -> None:
        self._sandbox = sandbox
        self._limits = limits
        self._concurrency = concurrency
        self._budget = budget or OutputBudget(0, 1)

    async def run_batch(
        self, spec: HandlerSpec, jobs: Sequence[JobInput], sink: ResultSink | None = None
    ) -> list[JobResult]:
        await self._sandbox.prepare()
        home = self._sandbox.make_dir(f"sh-{spec.client}-", spec.client)
        gate = asyncio.Semaphore(self._concurrency)

        async def one(job: JobInput) -> JobResult:
            async with gate:
                result = await self.run_job(spec, job, home)
                return result if sink is None else await sink.take(result)

        try:
            return list(await asyncio.gather(*(one(job) for job in jobs)))
        finally:
            await asyncio.to_thread(self._sandbox.remove_dir, home)

    async def run_job(self, spec: HandlerSpec, job: JobInput, home: Path) -> JobResult:
        try:
            proc = await self._sandbox.spawn(
                [SHELL, "-c", RUN_COMMAND],
                client=spec.client,
                home=home,
                stdin=subprocess.PIPE,
                env=self._env(spec, job),
            )
        except OSError as exc:
            return JobResult(id=job.id, exitcode=ERROR, result=f"cannot start {SHELL}: {exc}")
        stdout = bytearray()
        dropped = 0
        stderr = LineRing(STDERR_LINES)
        spend = self._budget.spender(spec.client)

        async def feed() -> None:
            assert proc.stdin is not None
            with contextlib.suppress(ConnectionError):
                proc.stdin.write(job.payload.encode("utf-8", "surrogatepass") + b"\n")
                await proc.stdin.drain()
                proc.stdin.close()

        async def collect() -> None:
            nonlocal dropped
            assert proc.stdout is not None
            while data := await proc.stdout.read(READ_SIZE):
                room = MAX_STDOUT - len(stdout)
                stdout.extend(data[:room])
                dropped += max(0, len(data) - room)
                await spend(len(data))

        assert proc.stderr is not None
        tasks = [
            asyncio.create_task(feed()),
            asyncio.create_task(collect()),
            asyncio.create_task(drain(proc.stderr, stderr, spend)),
        ]
        timed_out = False
        try:
            async with asyncio.timeout(spec.timeout):
                await proc.exited()
        except TimeoutError:
            timed_out = True
        finally:
            proc.kill_tree()  # background leftovers would hold the pipes open
            # the pipes end once the group is gone (a process that left it is cut off)
            await finish_reading(tasks, READ_GRACE)
            await proc.exited()
            proc.close()
            await self._sandbox.release(proc)
        return self._result(spec, job, proc.returncode, timed_out, bytes(stdout), dropped, stderr)

    @staticmethod
    def _env(spec: HandlerSpec, job: JobInput) -> dict[str, str]:
        env = {COMMAND_VARIABLE: spec.body}
        if job.traceparent is not None:  # the daemon traces (observe.tracing)
            env["TRACEPARENT"] = job.traceparent
        return env

    def _result(
        self,
        spec: HandlerSpec,
        job: JobInput,
        returncode: int | None,
        timed_out: bool,
        stdout: bytes,
        dropped: int,
        stderr: LineRing,
    ) -> JobResult:
        errors = [f"stderr: {line}" for line in stderr.lines()]
        if dropped:
            errors.append(f"stdout over {MAX_STDOUT} bytes: {dropped} bytes dropped")
            # the line cut at the limit is incomplete: a J: or S: line must not count
            stdout = stdout[: stdout.rfind(b"\n") + 1]
        parsed = parse_output(stdout.decode("utf-8", "replace"), self._limits, extra_log=errors)
        if timed_out:
            exitcode, result = TIMEOUT, f"timed out after {spec.timeout:g}s"
        elif returncode == 0:
            exitcode, result = OK, None
        else:
            last = next((line for line in reversed(stderr.lines()) if line.strip()), "")
            result = describe_exit(returncode) + (f": {last}" if last else "")
            exitcode = ERROR
        if parsed.exitcode is not None and not timed_out:
            exitcode = parsed.exitcode
            if parsed.result_set:
                result = parsed.result
        return JobResult(
            id=job.id,
            exitcode=exitcode,
            result=result,
            emits=parsed.emits,
            log=parsed.log,
            dropped=parsed.dropped,
            progress=parsed.progress,
        )

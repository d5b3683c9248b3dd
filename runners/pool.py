"""The runner pool: warm contexts for python and node handlers, shell and http runners.

A context serves one handler version, or the handlers of one eid of one tenant,
each loaded the first time a batch of its type comes (``HandlerSpec.context_key``;
a context that loaded another version of the batch's handler is not used). A batch
checks out an idle context of its key or starts one (at most ``max_contexts``
alive; the least recently used idle context makes room), runs, and checks it
back in. A context is closed instead of checked in when it crashed, timed out,
asked to be recycled, served ``max_jobs_per_context`` jobs, or its handler
was retired; idle ones are closed after ``idle_timeout`` by ``run()``. A context
nearing ``max_jobs_per_context`` gets its replacement started in the
background, so recycling never puts a cold start in a batch's way.

A handler that fails to load (``fatal``, or a context that dies while
starting) fails its jobs with 500 and is not started again for
``failure_backoff`` seconds, so a broken handler cannot respawn in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from queue_daemon.runners.budget import OutputBudget
from queue_daemon.runners.codes import ERROR
from queue_daemon.runners.context import Context
from queue_daemon.runners.errors import ContextFailed, SandboxError
from queue_daemon.runners.http import HttpRunner
from queue_daemon.runners.models import LANGS, HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import OutputLimits
from queue_daemon.runners.results import failed, not_run
from queue_daemon.runners.sandbox import Limits, Sandbox, TenantUids
from queue_daemon.runners.sandbox.addresses import AddressPolicy
from queue_daemon.runners.sandbox.cpuplace import RT_HOLD_S
from queue_daemon.runners.sandbox.users import NoUidYet
from queue_daemon.runners.settings import RunnerSettings
from queue_daemon.runners.shell import ShellRunner

__all__ = ["RunnerPool", "RunnerSettings"]

logger = logging.getLogger(__name__)

ContextKey = tuple[str, str, str]
PREWARM_AT = 0.5  # share of max_jobs_per_context after which the successor is started


LATE = "its lease may have run out before it could start"


def _too_late(start_by: float | None) -> bool:
    return start_by is not None and time.monotonic() > start_by


@dataclass(frozen=True, slots=True)
class _Failure:
    until: float
    message: str
    client: str
    type: str


class RunnerPool:
    """Runs batches of jobs for every language; see the module docstring."""

    def __init__(self, settings: RunnerSettings, tenant_uids: TenantUids | None = None) -> None:
        self.settings = settings
        self.sandbox = Sandbox(
            work_root=settings.work_root,
            limits=Limits(
                memory_bytes=settings.memory_bytes,
                cpu_seconds=settings.cpu_seconds,
                open_files=settings.open_files,
                processes=settings.processes,
                file_bytes=settings.file_bytes,
                shm_bytes=settings.shm_bytes,
            ),
            run_as=settings.run_as,
            prlimit=settings.prlimit,
            python=settings.python,
            network=settings.network,
            realtime=settings.realtime,
            tenant_uids=tenant_uids,
        )
        self._limits = OutputLimits(
            max_log_lines=settings.max_log_lines,
            max_log_bytes=settings.max_log_bytes,
            payload_limit=settings.payload_limit,
            max_emits=settings.max_emits_per_job,
            max_result_bytes=settings.max_result_bytes,
        )
        self.output_budget = OutputBudget(settings.output_rate, settings.output_burst)
        self._shell = ShellRunner(
            self.sandbox,
            self._limits,
            concurrency=settings.shell_concurrency,
            budget=self.output_budget,
        )
        self._http = HttpRunner(
            max_result_bytes=settings.max_result_bytes,
            concurrency=settings.http_concurrency,
            policy=AddressPolicy(settings.http_allow),
        )
        self._idle: dict[ContextKey, list[Context]] = {}
        self._busy: set[Context] = set()
        self._starting = 0
        self._room = asyncio.Event()
        self._failures: dict[ContextKey, _Failure] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._prewarming: dict[ContextKey, asyncio.Task[None]] = {}
        self._closed = False
        self.cold_starts: Counter[str] = Counter()  # lang -> contexts a batch had to wait for

    # ------------------------------------------------------------------ running

    async def run_batch(
        self,
        spec: HandlerSpec,
        jobs: Sequence[JobInput],
        sink: ResultSink | None = None,
        *,
        start_by: float | None = None,
    ) -> list[JobResult]:
        """One result per job, in order. Never raises for what a handler does.
        ``sink`` takes the results of python, node and shell jobs as they arrive;
        the caller handles the others from the list. ``start_by`` (a
        ``time.monotonic()`` moment): the batch is not started after it, its jobs
        end not run (the caller's hold on them may have lapsed meanwhile, a
        context that took long to start, or a daemon stopped for a while)."""
        if not jobs:
            return []
        if self._closed:
            return [not_run(job, "the runner pool is closed") for job in jobs]
        if spec.lang not in LANGS:
            return [failed(job, ERROR, f"unknown lang {spec.lang!r}") for job in jobs]
        try:
            await self.sandbox.prepare()
        except (SandboxError, OSError) as exc:
            logger.error("the sandbox cannot start handlers: %s", exc, extra={"action": "sandbox"})
            return [failed(job, ERROR, f"the sandbox cannot start handlers: {exc}") for job in jobs]
        try:
            self.sandbox.owner(spec.client)
        except NoUidYet as exc:
            return [not_run(job, str(exc)) for job in jobs]
        except SandboxError as exc:
            logger.error("%s", exc, extra={"action": "sandbox_uid", "tenant": spec.client})
            return [failed(job, ERROR, str(exc)) for job in jobs]
        if _too_late(start_by):
            return [not_run(job, LATE) for job in jobs]
        if spec.lang == "shell":
            return await self._shell.run_batch(spec, jobs, sink)
        if spec.lang == "http":
            return await self._http.run_batch(spec, jobs)
        return await self._run_in_context(spec, jobs, sink, start_by)

    async def _run_in_context(
        self,
        spec: HandlerSpec,
        jobs: Sequence[JobInput],
        sink: ResultSink | None,
        start_by: float | None,
    ) -> list[JobResult]:
        """A python or node batch, in a warm context of its handler (started if need be)."""
        key = spec.failure_key
        failure = self._failures.get(key)
        if failure is not None and failure.until > time.monotonic():
            return [failed(job, ERROR, failure.message) for job in jobs]
        try:
            context = await self._checkout(spec)
            if spec.type not in context.loaded:  # a context of its eid, warmed by another
                try:
                    await context.load(spec)
                except BaseException:
                    self._checkin(context)
                    raise
        except ContextFailed as exc:
            message = str(exc)
            self._failures[key] = _Failure(
                time.monotonic() + self.settings.failure_backoff, message, spec.client, spec.type
            )
            logger.warning(
                "%s handler %s-%s failed to start: %s",
                spec.lang,
                spec.client,
                spec.type,
                message,
                extra={"action": "context_fatal", "tenant": spec.client},
            )
            return [failed(job, ERROR, message) for job in jobs]
        if _too_late(start_by):  # nothing awaited from here until the batch is written
            self._checkin(context)
            return [not_run(job, LATE) for job in jobs]
        try:
            return await context.run_batch(jobs, spec.timeout, sink, spec.type)
        except BaseException:
            context.broken = True  # cancelled or failed mid-batch: never reuse it
            raise
        finally:
            self._checkin(context)

    async def _checkout(self, spec: HandlerSpec) -> Context:
        self._reap()
        key = spec.context_key
        while True:
            idle = self._idle.get(key)
            while idle:
                context = idle.pop()
                if not idle:
                    del self._idle[key]
                # a context of an eid that runs another version of this handler
                stale = context.loaded.get(spec.type, spec.version) != spec.version
                if context.alive and not stale:
                    self._busy.add(context)
                    return context
                self._close_later(context)
            successor = self._prewarming.get(key)
            if successor is None:
                break
            await asyncio.wait({successor})  # nearly ready: better than a cold start
        await self._make_room()
        context = await self._start(spec)
        self.cold_starts[spec.lang] += 1
        self._busy.add(context)
        logger.debug(
            "started a %s context for %s-%s (pid %s)",
            spec.lang,
            spec.client,
            spec.type,
            context.pid,
            extra={"action": "context_started", "tenant": spec.client},
        )
        return context

    async def _start(self, spec: HandlerSpec) -> Context:
        self._starting += 1
        try:
            context = Context(
                spec,
                sandbox=self.sandbox,
                command=await self._command(spec),
                limits=self._limits,
                spend=self.output_budget.spender(spec.client),
                start_timeout=max(self.settings.start_timeout, spec.timeout),
                memory="data" if spec.lang == "node" else "as",
            )
            await context.start()
            return context
        finally:
            self._starting -= 1
            self._room.set()

    async def _prewarm(self, old: Context) -> None:
        """Start the replacement of ``old`` (near its job limit); it takes over when ready."""
        try:
            new = await self._start(old.spec)
        except ContextFailed as exc:
            logger.warning(
                "starting the successor of a %s context failed: %s",
                old.spec.lang,
                exc,
                extra={"action": "context_prewarm_failed", "tenant": old.spec.client},
            )
            return
        if self._closed or old.retired or old.closed:
            self._close_later(new)  # the pool closed or the handler changed meanwhile
            return
        self._idle.setdefault(new.key, []).append(new)
        self._room.set()
        contexts = self._idle.get(old.key)
        if contexts is not None and old in contexts:
            self._forget_idle(old)
            self._close_later(old)
        else:
            old.retired = True  # busy: closed when its batch is done

    async def _command(self, spec: HandlerSpec) -> list[str]:
        if spec.lang == "python":
            return [self.sandbox.python, "-I", self.sandbox.bootstrap("python_boot.py")]
        from queue_daemon.runners.node import bootstrap_command, node_command

        try:
            node = await asyncio.to_thread(node_command)
        except OSError as exc:
            raise ContextFailed(f"cannot run node: {exc}") from None
        return bootstrap_command(node, Path(self.sandbox.bootstrap("node_boot.js")).parent)

    async def _make_room(self) -> None:
        while self._count() >= self.settings.max_contexts:
            victim = min(
                (c for contexts in self._idle.values() for c in contexts),
                key=lambda c: c.last_used,
                default=None,
            )
            if victim is not None:
                self._forget_idle(victim)
                self._close_later(victim)
                continue
            self._room.clear()
            await self._room.wait()

    def _count(self) -> int:
        idle = sum(len(contexts) for contexts in self._idle.values())
        return idle + len(self._busy) + self._starting

    def _checkin(self, context: Context) -> None:
        self._busy.discard(context)
        self._room.set()
        if (
            self._closed
            or context.retired
            or not context.alive
            or context.jobs_run >= self.settings.max_jobs_per_context
        ):
            self._close_later(context)
            return
        context.last_used = time.monotonic()
        self._idle.setdefault(context.key, []).append(context)
        limit = self.settings.max_jobs_per_context
        if (
            not context.successor
            and context.jobs_run >= limit * PREWARM_AT
            and self._count() < self.settings.max_contexts
        ):
            context.successor = True
            if context.key not in self._prewarming:
                task = asyncio.create_task(self._prewarm(context), name=f"prewarm-{context.pid}")
                self._prewarming[context.key] = task
                task.add_done_callback(self._prewarmed)

    def _prewarmed(self, task: asyncio.Task[None]) -> None:
        for key, known in list(self._prewarming.items()):
            if known is task:
                del self._prewarming[key]
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "starting a successor context failed",
                exc_info=task.exception(),
                extra={"action": "context_prewarm_failed"},
            )

    def _forget_idle(self, context: Context) -> None:
        contexts = self._idle.get(context.key)
        if contexts is not None and context in contexts:
            contexts.remove(context)
            if not contexts:
                del self._idle[context.key]

    def _close_later(self, context: Context) -> None:
        task = asyncio.create_task(context.close(), name=f"close-context-{context.pid}")
        self._closing.add(task)
        task.add_done_callback(self._closed_one)

    def _closed_one(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        self._room.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "closing a context failed",
                exc_info=task.exception(),
                extra={"action": "context_close_failed"},
            )

    # ------------------------------------------------------------------ upkeep

    def warm(self) -> set[str]:
        """Stored jobtypes (``client-type``) that have an idle context right now."""
        return {
            f"{c.spec.client}-{type}"
            for contexts in self._idle.values()
            for c in contexts
            for type in c.loaded
        }

    @property
    def busy_remark_s(self) -> float:
        """How long after the last busy tenant the busy marks should still be sent
        again at every check: past the real-time hold of the daemon's place, so the
        last re-mark ends it and processes started meanwhile are placed too."""
        return 2 * RT_HOLD_S

    async def mark_busy(self, clients: Set[str]) -> None:
        """``clients`` run more contexts at once than their share of the cores: their
        handlers yield the CPU to other tenants' on a wake-up (``Sandbox.mark_busy``)."""
        await self.sandbox.mark_busy(clients)

    def retire(self, client: str, type: str) -> None:
        """A new handler version (or none): idle contexts of the type close now, busy ones
        after their batch."""
        for contexts in list(self._idle.values()):
            for context in list(contexts):
                if context.spec.client == client and type in context.loaded:
                    self._forget_idle(context)
                    self._close_later(context)
        for context in self._busy:
            if context.spec.client == client and type in context.loaded:
                context.retired = True
        for key, failure in list(self._failures.items()):
            if failure.client == client and failure.type == type:
                del self._failures[key]

    def _reap(self) -> None:
        """Close contexts idle for longer than ``idle_timeout`` or dead; forget old failures."""
        now = time.monotonic()
        limit = self.settings.idle_timeout
        for contexts in list(self._idle.values()):
            for context in list(contexts):
                if now - context.last_used > limit or not context.alive:
                    self._forget_idle(context)
                    self._close_later(context)
        for key, failure in list(self._failures.items()):
            if failure.until <= now:
                del self._failures[key]

    async def run(self) -> None:
        """The reaper; the daemon runs it under its supervisor until shutdown.

        The sandbox is made first, not at the first batch: making it sweeps away
        what daemons that died left behind (their handlers' cgroups and what is
        still in them), also on a daemon that never runs a handler."""
        try:
            await self.sandbox.prepare()
        except (SandboxError, OSError) as exc:  # each batch says it again
            if not self._closed:
                logger.error(
                    "the sandbox cannot start handlers: %s", exc, extra={"action": "sandbox"}
                )
        interval = max(0.05, min(self.settings.idle_timeout / 4, 5.0))
        while not self._closed:
            await asyncio.sleep(interval)
            self._reap()

    async def close(self) -> None:
        """Close every context (busy ones are killed: their jobs end unfinished) and the
        http session."""
        self._closed = True
        for task in list(self._prewarming.values()):
            task.cancel()
        if self._prewarming:
            await asyncio.gather(*self._prewarming.values(), return_exceptions=True)
        for contexts in list(self._idle.values()):
            for context in list(contexts):
                self._forget_idle(context)
                self._close_later(context)
        for context in list(self._busy):
            context.broken = True
            self._close_later(context)
        while self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self._http.close()
        await self.sandbox.close()

    # ------------------------------------------------------------------ introspection

    def contexts(self) -> list[Context]:
        """Every live context, idle and busy (for tests and metrics)."""
        return [c for contexts in self._idle.values() for c in contexts] + list(self._busy)

    def contexts_by_lang(self) -> Counter[str]:
        """Live contexts (idle and busy) per language, for the metrics."""
        return Counter(c.spec.lang for c in self.contexts())

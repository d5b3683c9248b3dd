"""Warm contexts for python and node handlers: checked out for a batch, checked
back in, started, replaced and closed.

A context serves one handler version, or the handlers of one eid of one tenant,
each loaded the first time a batch of its type comes (``HandlerSpec.context_key``;
a context that loaded another version of the batch's handler is not used). A batch
checks out an idle context of its key or starts one (at most ``max_contexts``
alive; the least recently used idle context makes room), runs, and checks it
back in. A context is closed instead of checked in when it crashed, timed out,
asked to be recycled, served ``max_jobs_per_context`` jobs, or its handler
was retired; idle ones are closed after ``context_idle`` by ``reap()``. A context
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from queue_daemon.domain.names import JobType
from queue_daemon.runners.budget import OutputBudget
from queue_daemon.runners.codes import ERROR
from queue_daemon.runners.context import Context
from queue_daemon.runners.errors import ContextFailed
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import OutputLimits
from queue_daemon.runners.results import failed, not_run
from queue_daemon.runners.sandbox import Sandbox
from queue_daemon.runners.settings import RunnerSettings

logger = logging.getLogger(__name__)

ContextKey = tuple[str, str, str]
PREWARM_AT = 0.5  # share of max_jobs_per_context after which the successor is started
LATE = "its lease may have run out before it could start"


def too_late(start_by: float | None) -> bool:
    return start_by is not None and time.monotonic() > start_by


@dataclass(frozen=True, slots=True)
class _Failure:
    until: float
    message: str
    client: str
    type: str


class WarmContexts:
    """The live python and node contexts of one runner pool; see the module docstring."""

    def __init__(
        self,
        settings: RunnerSettings,
        sandbox: Sandbox,
        limits: OutputLimits,
        budget: OutputBudget,
    ) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self._limits = limits
        self._budget = budget
        self._idle: dict[ContextKey, list[Context]] = {}
        self._busy: set[Context] = set()
        self._starting = 0
        self._room = asyncio.Event()
        self._failures: dict[ContextKey, _Failure] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._prewarming: dict[ContextKey, asyncio.Task[None]] = {}
        self._closed = False
        self.cold_starts: Counter[str] = Counter()  # lang -> contexts a batch had to wait for

    async def run_batch(
        self,
        spec: HandlerSpec,
        jobs: Sequence[JobInput],
        sink: ResultSink | None,
        start_by: float | None,
    ) -> list[JobResult]:
        """A python or node batch, in a warm context of its handler (started if need be);
        never raises for what a handler does."""
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
        if too_late(start_by):  # nothing awaited from here until the batch is written
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
        self.reap()
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
                spend=self._budget.spender(spec.client),
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
        if spec.lang in ("python", "wasm"):  # wasm: runners.wasm's shim is the body
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

    def warm(self) -> set[str]:
        """Stored jobtypes (``client-type``) that have an idle context right now."""
        return {
            JobType(c.spec.client, type).stored
            for contexts in self._idle.values()
            for c in contexts
            for type in c.loaded
        }

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

    def reap(self) -> None:
        """Close contexts idle for longer than ``context_idle`` or dead; forget old failures."""
        now = time.monotonic()
        limit = self.settings.context_idle
        for contexts in list(self._idle.values()):
            for context in list(contexts):
                if now - context.last_used > limit or not context.alive:
                    self._forget_idle(context)
                    self._close_later(context)
        for key, failure in list(self._failures.items()):
            if failure.until <= now:
                del self._failures[key]

    async def close(self) -> None:
        """Close every context (busy ones are killed: their jobs end unfinished)."""
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

    def contexts(self) -> list[Context]:
        """Every live context, idle and busy."""
        return [c for contexts in self._idle.values() for c in contexts] + list(self._busy)

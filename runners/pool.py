"""The runner pool: warm contexts for python and node handlers (``runners.warm``),
shell, http and wasm runners, behind one ``run_batch``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence, Set

from queue_daemon.runners.budget import OutputBudget
from queue_daemon.runners.codes import ERROR, FORBIDDEN
from queue_daemon.runners.context import Context
from queue_daemon.runners.errors import ModuleError, SandboxError
from queue_daemon.runners.http import HttpRunner
from queue_daemon.runners.models import LANGS, HandlerSpec, JobInput, JobResult, ResultSink
from queue_daemon.runners.output import OutputLimits
from queue_daemon.runners.results import failed, not_run
from queue_daemon.runners.sandbox import ProcessLimits, Sandbox, TenantUids
from queue_daemon.runners.sandbox.addresses import AddressPolicy
from queue_daemon.runners.sandbox.cpuplace import RT_HOLD_S
from queue_daemon.runners.sandbox.users import NoUidYet
from queue_daemon.runners.settings import RunnerSettings
from queue_daemon.runners.shell import ShellRunner
from queue_daemon.runners.warm import LATE, WarmContexts, too_late
from queue_daemon.runners.wasm import BlobReader, WasmModules

__all__ = ["RunnerPool", "RunnerSettings"]

logger = logging.getLogger(__name__)

UNWALLED = (
    "not run: this daemon runs another tenant's handlers and no walls stand between"
    " tenants here (it is not root, and bubblewrap is missing or cannot make user"
    " namespaces); its operator can install bubblewrap, run it as root, or pass"
    " --trust-tenants (docs/security.md)"
)


class RunnerPool:
    """Runs batches of jobs for every language; see the module docstring."""

    def __init__(
        self,
        settings: RunnerSettings,
        tenant_uids: TenantUids | None = None,
        blobs: BlobReader | None = None,
    ) -> None:
        self.settings = settings
        self.sandbox = Sandbox(
            work_root=settings.work_root,
            limits=ProcessLimits(
                memory_bytes=settings.memory_bytes,
                cpu_seconds=settings.cpu_seconds,
                open_files=settings.open_files,
                processes=settings.processes,
                file_bytes=settings.file_bytes,
                tmp_size=settings.tmp_size,
            ),
            run_as=settings.run_as,
            prlimit=settings.prlimit,
            python=settings.python,
            network=settings.network,
            share=settings.share,
            bwrap=settings.bwrap,
            realtime=settings.realtime,
            tenant_uids=tenant_uids,
        )
        self._limits = OutputLimits(
            max_log_lines=settings.max_log_lines,
            max_log_bytes=settings.max_log_bytes,
            payload_limit=settings.payload_limit,
            max_emits=settings.max_emits_per_job,
            result_limit=settings.result_limit,
        )
        self.output_budget = OutputBudget(settings.output_rate, settings.output_burst)
        self._shell = ShellRunner(
            self.sandbox,
            self._limits,
            concurrency=settings.shell_concurrency,
            budget=self.output_budget,
        )
        self._http = HttpRunner(
            result_limit=settings.result_limit,
            concurrency=settings.http_concurrency,
            policy=AddressPolicy(settings.http_allow),
        )
        # a context's address space holds the module's memory and the interpreter
        self._wasm = WasmModules(
            memory=min(settings.wasm_memory, settings.memory_bytes // 2),
            cache_dir=settings.wasm_cache,
            blobs=blobs,
        )
        self._contexts = WarmContexts(settings, self.sandbox, self._limits, self.output_budget)
        self._closed = False
        self._first_tenant: str | None = None  # the one tenant run where no walls stand

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
        ``sink`` takes the results of python, node, shell and wasm jobs as they arrive;
        the caller handles the others (http) from the list. ``start_by`` (a
        ``time.monotonic()`` moment): the batch is not started after it, its jobs
        end not run (the caller's hold on them may have lapsed meanwhile, a
        context that took long to start, or a daemon stopped for a while)."""
        if not jobs:
            return []
        if self._closed:
            return [not_run(job, "the runner pool is closed") for job in jobs]
        if spec.lang not in LANGS:
            return [failed(job, ERROR, f"unknown lang {spec.lang!r}") for job in jobs]
        if spec.lang == "wasm":  # run by the shim in a python context
            try:
                spec = await self._wasm.context_spec(spec)
            except ModuleError as exc:
                return [failed(job, ERROR, str(exc)) for job in jobs]
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
        # wasm is its own wall: its contexts run no tenant code but the module
        if spec.lang not in ("http", "wasm") and not self._trusted(spec.client):
            return [failed(job, FORBIDDEN, UNWALLED) for job in jobs]
        if too_late(start_by):
            return [not_run(job, LATE) for job in jobs]
        if spec.lang == "shell":
            return await self._shell.run_batch(spec, jobs, sink)
        if spec.lang == "http":
            return await self._http.run_batch(spec, jobs)
        return await self._contexts.run_batch(spec, jobs, sink, start_by)

    def _trusted(self, client: str) -> bool:
        """Whether ``client``'s handlers may run here: always where walls stand
        between tenants (root's uids, or bubblewrap's namespaces) or the operator
        trusts them all, else for the first tenant run since the pool started."""
        if self.settings.trust_tenants or not self.sandbox.unwalled:
            return True
        if self._first_tenant is None:
            self._first_tenant = client
            logger.warning(
                "no walls stand between tenants here: only tenant %s's python, node and"
                " shell handlers run (--trust-tenants runs every tenant's)",
                client,
                extra={"action": "sandbox_one_tenant", "tenant": client},
            )
        return client == self._first_tenant

    # ------------------------------------------------------------------ upkeep

    def warm(self) -> set[str]:
        """Stored jobtypes (``client-type``) that have an idle context right now."""
        return self._contexts.warm()

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
        self._contexts.retire(client, type)

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
        interval = max(0.05, min(self.settings.context_idle / 4, 5.0))
        while not self._closed:
            await asyncio.sleep(interval)
            self._contexts.reap()

    async def close(self) -> None:
        """Close every context (busy ones are killed: their jobs end unfinished) and the
        http session."""
        self._closed = True
        await self._contexts.close()
        await self._http.close()
        await self.sandbox.close()

    # ------------------------------------------------------------------ introspection

    @property
    def cold_starts(self) -> Counter[str]:
        """Contexts a batch had to wait for, per language (for the metrics)."""
        return self._contexts.cold_starts

    def contexts(self) -> list[Context]:
        """Every live context, idle and busy (for tests and metrics)."""
        return self._contexts.contexts()

    def contexts_by_lang(self) -> Counter[str]:
        """Live contexts (idle and busy) per language, for the metrics."""
        return Counter(c.spec.lang for c in self.contexts())

"""What the daemon hands a runner and what it gets back (the runners' contract)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

LANGS = ("python", "node", "shell", "http", "wasm")


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerSpec:
    """One version of a tenant's handler, as stored."""

    version: str  # the stored handler id; a new version retires contexts of the old one
    client: str
    type: str  # the tenant's type name, without the client prefix
    lang: str  # one of LANGS
    body: str  # python/node source, shell command, http URL or wasm module
    before: str = ""  # once per context (python/node)
    before_each: str = ""  # before each batch (python/node)
    after_each: str = ""  # after each batch (python/node)
    eid: str = ""  # contexts are shared by the tenant's handlers with the same eid
    timeout: float = 30.0  # seconds per job
    then: str = ""  # type of the follow-on job an OK result chains into
    max_attempts: int = 5
    module: str = ""  # wasm: the blob ("sha256:<hex>") holding the module, if not the body
    memory: int = 0  # wasm: bytes of linear memory at most (0: the daemon's --wasm-memory)

    @property
    def context_key(self) -> tuple[str, str, str]:
        """Jobs with equal keys may run in the same context: one handler version's,
        or all the handlers of one eid of one tenant (in one language)."""
        if self.eid:
            return (self.client, f"eid:{self.eid}", self.lang)
        return (self.client, self.type, self.version)

    @property
    def failure_key(self) -> tuple[str, str, str]:
        """A handler version that failed to load (its jobs fail for a while)."""
        return (self.client, self.type, self.version)


# The objects made for every job of a batch (JobInput, JobResult; ClaimedJob
# and Release in queue_daemon.domain.jobs; PulledJob and a worker's Completion
# in queue_daemon.domain.pulled and engine.pull.pulls) are plain slotted dataclasses, not
# frozen ones: a frozen dataclass's __init__ sets each field through
# object.__setattr__, 2.6 times the cost (about 0.5 us a job each, measured).
# Nothing changes them after they are made.
@dataclass(slots=True, kw_only=True)
class JobInput:
    id: str
    payload: str
    attempt: int  # 1 on the first run
    traceparent: str | None = None  # its run's span, when the daemon traces (observe.tracing)


@dataclass(slots=True, kw_only=True)
class JobResult:
    """How one job ended. ``exitcode``: 1xx retry, 2xx ok, 4xx failed, 5xx error."""

    id: str
    exitcode: int
    result: str | None = None
    # follow-on jobs: (the tenant's own type name, payload); validated by the runner
    emits: Sequence[tuple[str, str]] = ()
    log: Sequence[str] = ()  # bounded
    # why each follow-on job the handler asked for was rejected (bad type or payload)
    dropped: Sequence[str] = ()
    # follow-on jobs the context dropped itself, over the run's emit limit in bytes
    emit_over: int = 0
    # of those, the ones dropped only because the batch's share of the add rate
    # was spent (``ResultSink.emit_budget``): the run is retried later if what
    # all its calls cost (``emit_cost``, bytes and 64 KiB a job) could ever fit
    emit_short: int = 0
    emit_cost: int = 0
    # False when the job never started (its context died or timed out on an
    # earlier job of the batch): the daemon puts it back without counting a run
    ran: bool = True
    # milliseconds from its start to its result, when the runner measured it
    run_ms: float | None = None
    # the context said it may be in a bad state (e.g. after a MemoryError): recycle it
    recycle: bool = False
    # the last ``P:`` line of its output: (fraction, message)
    progress: tuple[float, str] | None = None


class ResultSink(Protocol):
    """Takes each result that ``wants`` names as it arrives, before the next job's:
    the daemon takes the follow-on jobs out (journaling them in chunks), so a batch
    never holds every job's follow-on jobs at once."""

    def emit_limit(self) -> int:
        """Bytes of follow-on payloads a run of the batch may add: a context drops
        the rest itself (``emit_over`` in its reply), so they never reach the daemon."""

    def emit_budget(self) -> int | None:
        """Bytes of follow-on payloads the batch's runs may add together, taken in
        their order (None: no such bound): a context drops what is over
        (``emit_short`` in its reply). Asked once a batch: it may take a share
        of the tenant's rate, which its owner ends with the batch."""

    def wants(self, result: JobResult) -> bool:
        """Whether ``take`` would change ``result`` (follow-on jobs to take out)."""

    def progress(self, job_id: str, fraction: object, message: object) -> None:
        """A running job's progress as its context reported it (unchecked)."""

    async def take(self, result: JobResult) -> JobResult:
        """The result to keep."""

"""The runners' one frozen settings object."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from queue_daemon.runners.sandbox.addresses import Network


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSettings:
    work_root: Path  # private directories of contexts and shell batches are made below it
    context_idle: float = 60.0  # seconds an idle context stays warm
    max_jobs_per_context: int = 100_000  # then the context is recycled
    max_contexts: int = 64  # python/node contexts alive at once (idle + busy)
    memory_bytes: int = 1 << 30  # RLIMIT_AS of every handler process
    cpu_seconds: int = 3600  # RLIMIT_CPU, over a context's life
    open_files: int = 256  # RLIMIT_NOFILE
    # RLIMIT_NPROC counts all processes and threads of the run-as uid, shared by
    # every context (a node context alone has about ten threads)
    processes: int = 1024
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE
    tmp_size: int = 64 << 20  # each handler process tree's private /dev/shm (and /tmp)
    run_as: str | None = None  # None: queue-runner (created) or nobody when root; unused if not
    result_limit: int = 1 << 20
    max_log_lines: int = 100  # log lines kept per job
    max_log_bytes: int = 64 << 10
    payload_limit: int = 1 << 20  # bytes of one follow-on job's payload
    # optional, beyond the contract
    max_emits_per_job: int = 10_000
    start_timeout: float = 30.0  # seconds a context gets to load its handler and run `before`
    failure_backoff: float = 5.0  # seconds a handler that failed to load is not started again
    shell_concurrency: int = 4  # shell jobs of one batch running at once
    # bytes a second of one tenant's handler output the daemon reads, after a burst
    # (runners.budget); 0: no limit
    output_rate: float = 4 << 20
    output_burst: float = 16 << 20
    http_concurrency: int = 32  # requests of one batch in flight at once
    # networks http handlers may reach although they are not public (loopback, private, …)
    http_allow: tuple[Network, ...] = ()
    # directories bound read-write into every handler's view (the same for every tenant)
    share: tuple[Path, ...] = ()
    # where no walls stand between tenants (not root, no bubblewrap): False runs the
    # python, node and shell handlers of the first tenant only, True every tenant's
    trust_tenants: bool = False
    bwrap: str | None = "auto"  # path of bubblewrap, "auto" (search PATH) or None (none)
    python: str | None = None  # interpreter of python contexts (default: the daemon's own)
    # False: handlers run in a network namespace of their own (only its own loopback)
    # when the daemon is root and unshare works; True: they share the daemon's network
    network: bool = False
    # as root, the daemon's place (itself, its embedded PostgreSQL) runs real-time while
    # a tenant is busy (runners.sandbox.cpushare); False: it stays a normal process
    realtime: bool = False
    # wasm handlers: bytes of linear memory a module may have at most (at most half of
    # memory_bytes), and the directory of compiled modules (None: none)
    wasm_memory: int = 256 << 20
    wasm_cache: Path | None = None
    prlimit: str | None = "auto"  # path of prlimit, "auto" (search PATH) or None (python wrapper)

"""One frozen settings object for a daemon, built by the CLI from flags and environment.

Each setting has one name from its flag to its use (``--context-idle`` is
``context_idle`` here, in ``RunnerSettings`` and in the runners) and one
default: written here, or, for a value a part takes on as it is, in that part's
settings (``default_of``); the CLI's flags default to ``DEFAULTS``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from queue_daemon.engine.admit.limits import TenantLimits
from queue_daemon.observe.labels import METRICS_TENANTS, METRICS_TYPES
from queue_daemon.observe.logfile import Rotation
from queue_daemon.runners.sandbox.addresses import Network
from queue_daemon.runners.sandbox.users import TENANT_UID_BASE, TENANT_UID_SPAN
from queue_daemon.runners.settings import RunnerSettings

MIB = 1 << 20


def default_of(settings: type[Any], name: str) -> Any:
    """The default of field ``name`` of the dataclass ``settings``."""
    for field in fields(settings):
        if field.name == name and field.default is not MISSING:
            return field.default
    raise LookupError(f"{settings.__name__}.{name} has no default")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    data_dir: Path = Path("./queue-data")
    store: str | None = None  # DSN; None = embedded PostgreSQL in data_dir/pg
    journal: Path | None = None  # default data_dir/journal-<sysid>
    logfile: Path | None = None  # default data_dir/queue-<sysid>.log
    # rotate the queue logfile at this size (0 = never), and at the first write after UTC
    # midnight; gzip rotated queue logfiles (in a background thread)
    logfile_max_bytes: int = default_of(Rotation, "logfile_max_bytes")
    logfile_daily: bool = default_of(Rotation, "logfile_daily")
    logfile_gzip: bool = default_of(Rotation, "logfile_gzip")
    host: str = "127.0.0.1"
    port: int = 8080
    sysid: str | None = None  # None = reserved automatically in the store
    lease: float = 60.0  # seconds a claimed job (and a sysid) stays leased without renewal
    no_auth: bool = False
    realtime: bool = default_of(RunnerSettings, "realtime")  # as root, real-time while busy
    payload_limit: int = default_of(RunnerSettings, "payload_limit")
    body_limit: int = 64 * MIB
    handler_limit: int = MIB  # bytes of each handler source field (body, before, …)
    # seconds a client has to send a request's headers (from connecting, or from the
    # previous reply on a kept-alive connection), and to start and keep sending a body
    client_timeout: float = 30.0
    body_timeout: float = 120.0  # seconds a request body may take in all
    body_memory: int = 512 * MIB  # bytes of request bodies being read at once (a quarter each)
    max_connections: int | None = None  # None: the open-files limit less a reserve
    max_connections_per_address: int = 1024
    segment_bytes: int = 64 * MIB
    inline_journal: bool = True  # a quiet add's journal write on the event loop
    ingest_batch: int = 5000  # journal lines per store insert
    ingest_workers: int = 2  # concurrent reserve→insert→rsync pipelines
    drain_timeout: float = 10.0  # seconds SIGTERM waits for ingestion to catch up
    token_refresh: float = 2.0  # seconds between reloads of the tenant token cache
    store_connect_timeout: float = 30.0  # seconds start-up waits for PostgreSQL
    concurrency: int = 4096  # jobs running (or claimed to run next) at once in this daemon
    max_batch: int = 1000  # most jobs claimed (and handed to one context) at a time
    job_ttl: float = 86_400.0  # seconds after creation when retries stop
    retention: float = 7 * 86_400.0  # seconds archived jobs are kept
    tenant_uid_base: int = TENANT_UID_BASE  # the first uid of the tenants' range
    tenant_uid_count: int = TENANT_UID_SPAN  # uids in the range: tenants beyond it run nothing
    run_as: str | None = default_of(RunnerSettings, "run_as")  # user for handlers when root
    context_idle: float = default_of(RunnerSettings, "context_idle")  # seconds kept warm
    tenant_rate: float = 100_000.0  # jobs/s one tenant may add (0 = unlimited)
    tenant_burst: float = 200_000.0  # jobs one tenant may add at once above the rate
    tenant_running: int | None = None  # jobs of one tenant running at once per daemon
    http_allow: tuple[Network, ...] = default_of(RunnerSettings, "http_allow")
    handler_share: tuple[Path, ...] = default_of(RunnerSettings, "share")  # read-write in views
    trust_tenants: bool = default_of(RunnerSettings, "trust_tenants")  # unwalled: every tenant
    mdns: bool = False  # advertise the daemon with multicast DNS (observe.mdns)
    otlp_endpoint: str | None = None  # traces exported there (observe.tracing); None: off
    tenant_waiting: int = 1_000_000  # waiting + scheduled jobs of one tenant (0 = no limit)
    tenant_handlers: int = 1000  # live handlers of one tenant (0 = no limit)
    tenant_follow_ons: int = 1000  # follow-on jobs one run may add
    tenant_emit: int = 4 * MIB  # bytes of follow-on payloads one run may add
    tenant_blobs: int = 1024 * MIB  # bytes of blobs one tenant holds (0 = no limit)
    result_limit: int = default_of(RunnerSettings, "result_limit")  # bytes of a result kept
    tmp_size: int = default_of(RunnerSettings, "tmp_size")  # each handler tree's /dev/shm, /tmp
    wasm_memory: int = default_of(RunnerSettings, "wasm_memory")  # a wasm module's memory
    output_rate: int = default_of(RunnerSettings, "output_rate")  # bytes/s of a tenant's output
    waiting_refresh: float = 1.0  # seconds between counts of an adding tenant's waiting jobs
    ready_lag: float = 30.0  # seconds of ingest lag over which /readyz answers 503
    metrics_tenants: int = METRICS_TENANTS  # tenants with a metrics label of their own
    metrics_types: int = METRICS_TYPES  # (tenant, type) pairs with a type label (0: none)

    def tenant_defaults(self) -> TenantLimits:
        """Every tenant's limits unless the store holds overrides for it."""
        return TenantLimits(
            running=self.tenant_running or 0,
            waiting=self.tenant_waiting,
            rate=self.tenant_rate,
            burst=self.tenant_burst,
            payload=self.payload_limit,
            result=self.result_limit,
            handlers=self.tenant_handlers,
            follow_ons=self.tenant_follow_ons,
            emit=self.tenant_emit,
            blobs=self.tenant_blobs,
        )

    def journal_dir(self, sysid: str) -> Path:
        return self.journal if self.journal is not None else self.data_dir / f"journal-{sysid}"

    @property
    def work_root(self) -> Path:
        """Where handler processes get their private working directories."""
        return (self.data_dir / "run").resolve()

    def logfile_path(self, sysid: str) -> Path:
        return self.logfile if self.logfile is not None else self.data_dir / f"queue-{sysid}.log"


DEFAULTS = Settings()  # what a flag or variable not given is

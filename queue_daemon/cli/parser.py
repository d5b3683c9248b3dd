"""The ``queue-daemon`` argument parser: every subcommand and flag, each flag with
its environment variable ``QUEUE_DAEMON_<FLAG>`` (a flag given on the command
line wins over the environment).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from queue_daemon.cli.tenant_client import add_parsers
from queue_daemon.settings import DEFAULTS

ENV = "QUEUE_DAEMON_"
DESCRIPTION = """``queue-daemon`` command line: the only place that configures logging.

Every flag has an environment variable ``QUEUE_DAEMON_<FLAG>``; a flag given
on the command line wins over the environment.
"""


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(ENV + name.upper(), default)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=_env("data_dir", str(DEFAULTS.data_dir)),
        help="data directory (env QUEUE_DAEMON_DATA_DIR, default ./queue-data)",
    )
    parser.add_argument(
        "--store",
        default=_env("store"),
        help="PostgreSQL DSN (env QUEUE_DAEMON_STORE); default: embedded server in DATA_DIR/pg",
    )
    parser.add_argument(
        "--log-level", default=_env("log_level", "INFO"), help="env QUEUE_DAEMON_LOG_LEVEL"
    )


def flag(value: str) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queue-daemon", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a daemon")
    _common(serve)
    serve.add_argument("--host", default=_env("host", DEFAULTS.host), help="env QUEUE_DAEMON_HOST")
    serve.add_argument("--port", default=_env("port", DEFAULTS.port), help="0 = any free port")
    serve.add_argument("--journal", default=_env("journal"), help="default DATA_DIR/journal-SYSID")
    serve.add_argument(
        "--logfile", default=_env("logfile"), help="default DATA_DIR/queue-SYSID.log"
    )
    serve.add_argument(
        "--logfile-max-bytes",
        default=_env("logfile_max_bytes", DEFAULTS.logfile_max_bytes),
        help="rotate the queue logfile at this size (0 = never; default 256 MiB)",
    )
    serve.add_argument(
        "--logfile-daily",
        default=_env("logfile_daily", "on" if DEFAULTS.logfile_daily else "off"),
        help="on|off: also rotate the queue logfile at UTC midnight (default on)",
    )
    serve.add_argument(
        "--logfile-gzip",
        action="store_true",
        default=flag(_env("logfile_gzip", "")),
        help="gzip rotated queue logfiles",
    )
    serve.add_argument("--sysid", default=_env("sysid"), help="default: reserved in the store")
    serve.add_argument("--lease", default=_env("lease", DEFAULTS.lease), help="seconds, default 60")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        default=flag(_env("no_auth", "")),
        help="anonymous access (loopback addresses only)",
    )
    serve.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        # off unless asked for; QUEUE_DAEMON_NO_REALTIME, the old switch, still turns it off
        default=flag(_env("realtime", "")) and not flag(_env("no_realtime", "")),
        help="as root, run the daemon and its embedded PostgreSQL at real-time priority "
        "(SCHED_RR 1) while a tenant is busy; env QUEUE_DAEMON_REALTIME; default off "
        "(see docs/operations.md)",
    )
    serve.add_argument(
        "--inline-journal",
        action=argparse.BooleanOptionalAction,
        default=not flag(_env("no_inline_journal", "")),
        help="write a small add that finds the journal quiet on the event loop, not "
        "the write thread (faster on an idle daemon; a disk that stalls holds the "
        "loop meanwhile); env QUEUE_DAEMON_NO_INLINE_JOURNAL=1 turns it off; default on",
    )
    serve.add_argument(
        "--payload-limit",
        default=_env("payload_limit", DEFAULTS.payload_limit),
        help="bytes per payload line",
    )
    serve.add_argument(
        "--body-limit",
        default=_env("body_limit", DEFAULTS.body_limit),
        help="bytes per request body",
    )
    serve.add_argument(
        "--handler-limit",
        default=_env("handler_limit", DEFAULTS.handler_limit),
        help="bytes of a handler's source (each of body, before, beforeEach, afterEach)",
    )
    serve.add_argument(
        "--client-timeout",
        default=_env("client_timeout", DEFAULTS.client_timeout),
        help="seconds a client has to send a request's headers, and to keep a body coming",
    )
    serve.add_argument(
        "--body-timeout",
        default=_env("body_timeout", DEFAULTS.body_timeout),
        help="seconds a request body may take in all (408 past it)",
    )
    serve.add_argument(
        "--body-memory",
        default=_env("body_memory", DEFAULTS.body_memory),
        help="bytes of request bodies being read at once (503 past it), a quarter of it (at"
        " least --body-limit) per tenant (429); default 512 MiB",
    )
    serve.add_argument(
        "--max-connections",
        default=_env("max_connections", DEFAULTS.max_connections or 0),
        help="client connections held at once (0 = the open-files limit less 1024 kept for"
        " the store, the journal and the handlers)",
    )
    serve.add_argument(
        "--max-connections-per-address",
        default=_env("max_connections_per_address", DEFAULTS.max_connections_per_address),
        help="client connections held at once from one address (default 1024)",
    )
    serve.add_argument(
        "--drain-timeout",
        default=_env("drain_timeout", DEFAULTS.drain_timeout),
        help="seconds SIGTERM waits for ingestion to catch up",
    )

    serve.add_argument(
        "--concurrency",
        default=_env("concurrency", DEFAULTS.concurrency),
        help="jobs running at once",
    )
    serve.add_argument(
        "--max-batch",
        default=_env("max_batch", DEFAULTS.max_batch),
        help="jobs claimed and run as one batch",
    )
    serve.add_argument(
        "--job-ttl",
        default=_env("job_ttl", DEFAULTS.job_ttl),
        help="seconds after creation when retries stop (default one day)",
    )
    serve.add_argument(
        "--retention",
        default=_env("retention", DEFAULTS.retention),
        help="seconds archived jobs are kept (default seven days)",
    )
    serve.add_argument(
        "--run-as",
        default=_env("run_as"),
        help="one user for all handler processes when running as root (default: a uid per tenant)",
    )
    serve.add_argument(
        "--tenant-uid-base",
        default=_env("tenant_uid_base", DEFAULTS.tenant_uid_base),
        help="as root, the first uid of the range tenants' handlers run under (default 2000000)",
    )
    serve.add_argument(
        "--tenant-uid-count",
        default=_env("tenant_uid_count", DEFAULTS.tenant_uid_count),
        help="uids in that range (default 1048576)",
    )
    serve.add_argument(
        "--http-allow",
        default=_env("http_allow", ""),
        help="CIDR[,CIDR...] that http handlers may reach although not public "
        "(loopback, private, link-local...; default: none)",
    )
    serve.add_argument(
        "--trust-tenants",
        action="store_true",
        default=flag(_env("trust_tenants", "")),
        help="run every tenant's python, node and shell handlers even where no walls"
        " stand between them (not root, no bubblewrap or user namespaces); env"
        " QUEUE_DAEMON_TRUST_TENANTS; default: only the first tenant's (docs/security.md)",
    )
    serve.add_argument(
        "--otlp-endpoint",
        default=_env("otlp_endpoint", None),
        help="export traces (OpenTelemetry, OTLP over HTTP) to this URL, e.g."
        " http://collector:4318/v1/traces; env QUEUE_DAEMON_OTLP_ENDPOINT, or the SDK's"
        " OTEL_EXPORTER_OTLP_ENDPOINT; default: no traces (docs/operations.md)",
    )
    serve.add_argument(
        "--mdns",
        action="store_true",
        default=flag(_env("mdns", "")),
        help="advertise this daemon on the local network with multicast DNS as"
        " _queue-daemon._tcp.local. (queue_daemon.client.discover finds it); env QUEUE_DAEMON_MDNS",
    )
    serve.add_argument(
        "--handler-share",
        default=_env("handler_share", ""),
        help="DIR[,DIR...] bound read-write into every handler's view, the same for every"
        " tenant (tests, single-tenant setups; docs/security.md); default: none",
    )
    serve.add_argument(
        "--context-idle",
        default=_env("context_idle", DEFAULTS.context_idle),
        help="seconds an idle handler context stays warm",
    )

    serve.add_argument(
        "--tenant-rate",
        default=_env("tenant_rate", DEFAULTS.tenant_rate),
        help="jobs/s one tenant may add (0 = unlimited; over it: 429 with Retry-After)",
    )
    serve.add_argument(
        "--tenant-burst",
        default=_env("tenant_burst", DEFAULTS.tenant_burst),
        help="jobs one tenant may add at once above its rate",
    )
    serve.add_argument(
        "--tenant-running",
        default=_env("tenant_running", DEFAULTS.tenant_running or 0),
        help="jobs of one tenant running at once in this daemon (0 = no cap)",
    )
    serve.add_argument(
        "--tenant-waiting",
        default=_env("tenant_waiting", DEFAULTS.tenant_waiting),
        help="waiting jobs one tenant may have (0 = no limit; over it: 429 with Retry-After)",
    )
    serve.add_argument(
        "--tenant-handlers",
        default=_env("tenant_handlers", DEFAULTS.tenant_handlers),
        help="handlers one tenant may have (0 = no limit)",
    )
    serve.add_argument(
        "--tenant-follow-ons",
        default=_env("tenant_follow_ons", DEFAULTS.tenant_follow_ons),
        help="follow-on jobs one run may add (more are dropped; 0 = none)",
    )
    serve.add_argument(
        "--tenant-emit",
        default=_env("tenant_emit", DEFAULTS.tenant_emit),
        help="bytes of follow-on payloads one run may add (more are dropped; default 4 MiB)",
    )
    serve.add_argument(
        "--tenant-blobs",
        default=_env("tenant_blobs", DEFAULTS.tenant_blobs),
        help="bytes of blobs one tenant holds (0 = no limit; default 1 GiB)",
    )
    serve.add_argument(
        "--tmp-size",
        default=_env("tmp_size", DEFAULTS.tmp_size),
        help="bytes of the private /dev/shm and /tmp (tmpfs) of each handler context or shell"
        " job, as root (default 64 MiB)",
    )
    serve.add_argument(
        "--wasm-memory",
        default=_env("wasm_memory", DEFAULTS.wasm_memory),
        help="bytes of linear memory a wasm handler's module may have at most (a handler's"
        ' "memory" may set less; default 256 MiB)',
    )
    serve.add_argument(
        "--output-rate",
        default=_env("output_rate", DEFAULTS.output_rate),
        help="bytes/s of one tenant's handler output the daemon reads, after a burst of four"
        " seconds' worth; past it the handlers' writes wait (0 = no limit; default 4 MiB)",
    )
    serve.add_argument(
        "--result-limit",
        default=_env("result_limit", DEFAULTS.result_limit),
        help="bytes of a job's result kept (a longer one is cut)",
    )
    serve.add_argument(
        "--ready-lag",
        default=_env("ready_lag", DEFAULTS.ready_lag),
        help="seconds of ingest lag over which /readyz answers 503",
    )
    serve.add_argument(
        "--metrics-tenants",
        default=_env("metrics_tenants", DEFAULTS.metrics_tenants),
        help="tenants given a metrics label of their own; later ones are _other",
    )
    serve.add_argument(
        "--event-loop",
        choices=("uvloop", "asyncio"),
        default=_env("event_loop", "uvloop"),
        help="the event loop the daemon runs on (default uvloop; asyncio: the standard one)",
    )
    serve.add_argument(
        "--metrics-types",
        default=_env("metrics_types", DEFAULTS.metrics_types),
        help="(tenant, type) pairs given a type label of their own (0 = no type labels)",
    )

    tenant = sub.add_parser("tenant", help="manage tenants")
    tsub = tenant.add_subparsers(dest="action", required=True)
    for action, text in (("add", "create a tenant and print its token"), ("revoke", "revoke")):
        p = tsub.add_parser(action, help=text)
        _common(p)
        p.add_argument("client")
    rotate = tsub.add_parser(
        "rotate", help="issue a new token; the old one works until the grace period ends"
    )
    _common(rotate)
    rotate.add_argument("client")
    rotate.add_argument(
        "--grace", default="3600", help="seconds the previous token stays valid (default 3600)"
    )
    _common(tsub.add_parser("list", help="list tenants"))
    for action, text in (
        ("pause", "pause every type of a tenant: its jobs wait until resumed"),
        ("resume", "resume a paused tenant"),
    ):
        p = tsub.add_parser(action, help=text)
        _common(p)
        p.add_argument("client")
    limits = tsub.add_parser(
        "limits",
        help="show or set a tenant's limits: KEY=VALUE (KEY=default drops an override)",
    )
    _common(limits)
    limits.add_argument("client")
    limits.add_argument("changes", nargs="*", metavar="KEY=VALUE")

    admin = sub.add_parser("admin", help="operator tokens, the host's directories")
    asub = admin.add_subparsers(dest="action", required=True)
    admin_token = asub.add_parser(
        "token", help="issue a new operator token; the previous one works for the grace period"
    )
    _common(admin_token)
    admin_token.add_argument(
        "--grace", default="0", help="seconds the previous token stays valid (default 0)"
    )
    _common(asub.add_parser("revoke", help="end every operator token"))
    sweep = asub.add_parser(
        "sweep-homes",
        help="as root, remove the directories below /var/lib/queue-daemon (embedded server"
        " data, handlers' directories) of data directories that are gone, stopping their"
        " servers; a daemon does this as it starts (see docs/operations.md)",
    )
    sweep.add_argument(
        "--dry-run",
        action="store_true",
        default=flag(_env("dry_run", "")),
        help="list what would be removed, remove and stop nothing (env QUEUE_DAEMON_DRY_RUN)",
    )
    sweep.add_argument(
        "--unmarked-older-than",
        default=_env("unmarked_older_than"),
        metavar="DAYS",
        help="also remove directories that name no data directory (made by an earlier"
        " version) when nothing uses them and nothing in them changed for DAYS days (env"
        " QUEUE_DAEMON_UNMARKED_OLDER_THAN; default: never)",
    )
    sweep.add_argument("--log-level", default=_env("log_level", "WARNING"))

    journal = sub.add_parser("journal", help="journal tools")
    jsub = journal.add_subparsers(dest="action", required=True)
    check = jsub.add_parser("check", help="verify a journal and print what it holds")
    check.add_argument("path")
    check.add_argument("--log-level", default=_env("log_level", "WARNING"))
    stats = sub.add_parser(
        "stats",
        help="analytics from queue logfiles (live, rotated or gzipped)",
        description="Per tenant and type: jobs added, done by code, retries, queue wait "
        "and run time percentiles, throughput per minute.",
    )
    stats.add_argument("logfiles", nargs="+", metavar="LOGFILE")
    stats.add_argument("--since", help="from this time on (ISO-8601 or epoch ms)")
    stats.add_argument("--until", help="before this time (ISO-8601 or epoch ms)")
    stats.add_argument(
        "--tenant", action="append", help="only this tenant (may be given more than once)"
    )
    stats.add_argument("--json", action="store_true", help="print the report as JSON")
    stats.add_argument("--html", metavar="FILE", help="also write a report with charts to FILE")
    stats.add_argument("--log-level", default=_env("log_level", "WARNING"))
    add_parsers(sub)
    return parser

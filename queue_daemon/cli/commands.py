"""The subcommands other than ``serve``: ``tenant``, ``admin`` (``sweep-homes``
too), ``stats`` and ``journal check``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from queue_daemon.api.tokens import hash_token, new_token
from queue_daemon.cli.config import CliError, number
from queue_daemon.domain.names import valid_client
from queue_daemon.engine.admit.limits import LIMIT_KEYS, LimitsError, validate_overrides
from queue_daemon.settings import Settings
from queue_daemon.store.errors import Conflict, NotFound
from queue_daemon.store.ports import Store
from queue_daemon.wiring.store import open_store

RESERVED_CLIENTS = frozenset({"admin"})  # its paths would collide with /admin/... routes


def _time_arg(value: str | None, flag: str) -> int | None:
    from queue_daemon.tools.analytics import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise CliError(f"{flag} must be ISO-8601 or epoch milliseconds, not {value!r}") from None


def stats_command(args: argparse.Namespace) -> int:
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


def sweep_homes_command(args: argparse.Namespace) -> int:
    """``admin sweep-homes``: one line per directory removed or kept, and why."""
    from queue_daemon.store import embedded
    from queue_daemon.store.homes import sweep_homes

    days = args.unmarked_older_than
    age = None if days is None else number(days, "--unmarked-older-than", float) * 86400
    root = embedded.SERVER_HOME
    try:
        outcomes = sweep_homes(root, unmarked_older_than=age, dry_run=args.dry_run)
    except PermissionError as exc:
        raise CliError(f"cannot sweep {root} (root's): {exc.strerror or exc}") from None
    for o in outcomes:
        owner = f" ({o.owner})" if o.owner is not None else ""
        print(f"{'removed' if o.removed else 'kept'}\t{o.home}{owner}\t{o.reason}")
    removed = sum(o.removed for o in outcomes)
    print(f"{removed} removed, {len(outcomes) - removed} kept", file=sys.stderr)
    return 0


async def admin_command(args: argparse.Namespace) -> int:
    if args.action == "sweep-homes":
        return await asyncio.to_thread(sweep_homes_command, args)
    grace = number(args.grace, "--grace", float, 0) if args.action == "token" else 0.0
    settings = Settings(data_dir=Path(args.data_dir), store=args.store or None)
    store, embedded = await open_store(settings)
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


async def _tenant_setting(store: Store, args: argparse.Namespace) -> None:
    """``tenant pause|resume|limits CLIENT``."""
    try:
        if args.action == "limits":
            overrides = await store.get_tenant_limits(args.client)
            if args.changes:
                overrides = await store.set_tenant_limits(
                    args.client, _limit_changes(overrides, args.changes)
                )
            # the overrides; every other limit is the daemon's flag
            print(orjson.dumps({"client": args.client, "overrides": overrides}).decode())
        else:
            await store.pause_tenant(args.client, paused=args.action == "pause")
            print(f"tenant {args.client} {args.action}d")
    except NotFound:
        raise CliError(f"no active tenant {args.client}") from None


async def tenant_command(args: argparse.Namespace) -> int:
    grace = number(args.grace, "--grace", float, 0) if args.action == "rotate" else 0.0
    if args.action == "add":
        if not valid_client(args.client):
            raise CliError("client must match [a-z0-9_]{1,40}")
        if args.client in RESERVED_CLIENTS:
            raise CliError(f"{args.client} is reserved: /{args.client}/… are operator routes")
    settings = Settings(data_dir=Path(args.data_dir), store=args.store or None)
    store, embedded = await open_store(settings)
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
        elif args.action in ("pause", "resume", "limits"):
            await _tenant_setting(store, args)
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


def journal_check(args: argparse.Namespace) -> int:
    from queue_daemon.journal import check

    path = Path(args.path)
    if not path.is_dir():
        raise CliError(f"{path} is not a journal directory")
    report = check(path)
    print(report.format())
    return 0 if report.ok else 1

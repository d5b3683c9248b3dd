"""``queue-daemon job …``, ``type pause|resume`` and ``worker run …``: a tenant drives the
queue from a shell, through the client library, against ``--url`` with
``--client`` and ``--token`` (or ``QUEUE_URL``, ``QUEUE_CLIENT``, ``QUEUE_TOKEN``).
Replies are printed as JSON; an error is one line on stderr and exit 1."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from typing import Any

import orjson

from queue_daemon.client import Client, QueueError, Worker


def add_parsers(sub: Any) -> None:
    """The ``job`` and ``worker`` subcommands, on ``sub`` (the parser's subparsers)."""
    job = sub.add_parser("job", help="add, read, wait for, cancel and list jobs over HTTP")
    jsub = job.add_subparsers(dest="action", required=True)
    add = jsub.add_parser("add", help="add jobs: PAYLOAD arguments, or lines of stdin with -")
    add.add_argument("type")
    add.add_argument("payloads", nargs="+", metavar="PAYLOAD")
    add.add_argument("--json", action="store_true", help="each PAYLOAD is a JSON value")
    add.add_argument("--delay", type=float, help="seconds before the jobs are due")
    add.add_argument("--dt", help="when the jobs are due (ISO-8601 or epoch ms)")
    add.add_argument("--key", help="Idempotency-Key: the same key adds once")
    add.add_argument("--after", help="ids of jobs these wait for, comma-separated")
    add.add_argument("--requires", choices=("all-completed", "all-resolved"))
    add.add_argument("--deadline", help="seconds from now, epoch ms or ISO-8601")
    add.add_argument("--priority", type=int, help="-100 to 100: higher runs first (default 0)")
    add.add_argument(
        "--concurrency-key",
        help="the jobs' concurrency key: a handler's keyConcurrency caps how many run at once",
    )
    get = jsub.add_parser("get", help="a job")
    get.add_argument("id")
    get.add_argument("--wait", type=float, help="hold up to this many seconds until it is done")
    wait = jsub.add_parser("wait", help="wait until a job is done, print it")
    wait.add_argument("id")
    wait.add_argument("--timeout", type=float)
    cancel = jsub.add_parser("cancel", help="cancel a waiting job")
    cancel.add_argument("id")
    rerun = jsub.add_parser("rerun", help="a done job waits again, with fresh attempts")
    rerun.add_argument("id")
    failed = jsub.add_parser("rerun-failed", help="rerun the failed and errored jobs")
    failed.add_argument("--type")
    failed.add_argument("--code", choices=("failed", "error"), help="only these (default both)")
    failed.add_argument("--before", help="done before (ISO-8601 or epoch ms; default now)")
    listing = jsub.add_parser("list", help="a page of jobs, newest first")
    listing.add_argument("--type")
    listing.add_argument("--state", choices=("blocked", "waiting", "running", "done"))
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--after", help="the cursor of the previous page's next")
    kind = sub.add_parser("type", help="pause or resume a type over HTTP")
    ksub = kind.add_subparsers(dest="action", required=True)
    pause = ksub.add_parser("pause", help="its jobs wait (adds are still taken) until resumed")
    pause.add_argument("type")
    resume = ksub.add_parser("resume", help="its jobs run again")
    resume.add_argument("type")
    worker = sub.add_parser("worker", help="run a function on the jobs of a pulled type")
    wsub = worker.add_subparsers(dest="action", required=True)
    run = wsub.add_parser("run", help="claim and run jobs until SIGTERM")
    run.add_argument("function", metavar="MODULE:FUNCTION")
    run.add_argument("--type", required=True)
    run.add_argument("--name", help="the worker's name (default host-pid)")
    run.add_argument("--concurrency", type=int, default=16)
    run.add_argument("--batch", type=int, default=100)
    run.add_argument("--wait", type=float, default=20.0, help="seconds a claim is held")
    run.add_argument("--grace", type=float, default=30.0, help="seconds to finish on SIGTERM")
    for parser in (add, get, wait, cancel, rerun, failed, listing, pause, resume, run):
        parser.add_argument("--url", default=os.environ.get("QUEUE_URL"), help="env QUEUE_URL")
        parser.add_argument(
            "--client", default=os.environ.get("QUEUE_CLIENT"), help="env QUEUE_CLIENT"
        )
        parser.add_argument(
            "--token", default=os.environ.get("QUEUE_TOKEN"), help="env QUEUE_TOKEN"
        )
        parser.add_argument("--log-level", default=os.environ.get("QUEUE_LOG_LEVEL", "WARNING"))


def _print(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")


def _function(spec: str) -> Any:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{spec!r} is not MODULE:FUNCTION")
    sys.path.insert(0, os.getcwd())
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # the module's own error (a syntax error, a failing import)
        raise ValueError(f"cannot import {module}: {type(exc).__name__}: {exc}") from None
    found = getattr(imported, name, None)
    if not callable(found):
        raise ValueError(f"{module} has no function {name}")
    return found


async def _job(args: argparse.Namespace, q: Client) -> None:
    if args.action == "add":
        payloads = (
            [line for line in sys.stdin.read().splitlines() if line]
            if args.payloads == ["-"]
            else args.payloads
        )
        items: list[Any] = [orjson.loads(p) for p in payloads] if args.json else payloads
        _print(
            {
                "ids": await q.add(
                    args.type,
                    items,
                    json=args.json,
                    delay=args.delay,
                    dt=args.dt,
                    idempotency_key=args.key,
                    after=args.after.split(",") if args.after else (),
                    requires=args.requires,
                    deadline=args.deadline,
                    priority=args.priority,
                    key=args.concurrency_key,
                )
            }
        )
    elif args.action == "get":
        _print(await q.get(args.id, wait=args.wait))
    elif args.action == "wait":
        _print(await q.wait(args.id, timeout=args.timeout))
    elif args.action == "cancel":
        _print(await q.cancel(args.id))
    elif args.action == "rerun":
        _print(await q.rerun(args.id))
    elif args.action == "rerun-failed":
        _print({"rerun": await q.rerun_failed(args.type, code=args.code, before=args.before)})
    else:
        _print(await q.list(type=args.type, state=args.state, limit=args.limit, after=args.after))


async def _run(args: argparse.Namespace) -> None:
    async with Client(args.url, args.client, args.token) as q:
        if args.command == "job":
            await _job(args, q)
            return
        if args.command == "type":
            pause = args.action == "pause"
            _print(await (q.pause(args.type) if pause else q.resume(args.type)))
            return
        worker = Worker(
            q,
            args.type,
            _function(args.function),
            name=args.name,
            concurrency=args.concurrency,
            batch=args.batch,
            wait=args.wait,
            grace=args.grace,
        )
        await worker.run()


def tenant_client_command(args: argparse.Namespace) -> int:
    logging.getLogger().setLevel(str(args.log_level).upper())
    missing = [flag for flag in ("url", "client") if not getattr(args, flag)]
    if missing:
        print(
            f"queue-daemon: error: give --{missing[0]} (or QUEUE_{missing[0].upper()})",
            file=sys.stderr,
        )
        return 2
    try:
        asyncio.run(_run(args))
    except (QueueError, TimeoutError, ValueError, ImportError) as exc:
        print(f"queue-daemon: error: {exc}", file=sys.stderr)
        return 1
    return 0

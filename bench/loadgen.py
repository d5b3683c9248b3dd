"""The Python load generator: ``python -m bench.loadgen URL ...``, a process of its own.

It runs ``--procs`` worker processes; each opens ``--conns`` keep-alive
connections and sends the same POST on each in a closed loop (one request in
flight per connection, like wrk). A minimal HTTP/1.1 client on asyncio streams
is used rather than aiohttp's client, whose per-request cost is several times
higher: on a 2-core machine the generator shares the CPU with the server it
measures, so the lighter it is the truer the figure.

Only responses that complete inside the measured window (after ``--warmup``,
for ``--duration`` seconds) are counted; 200s are counted apart from every
other status and from connection errors. A 200 whose body does not hold one id
per line sent counts as an error. The result is one JSON line on stdout,
prefixed ``RESULT``; ``WINDOW start`` / ``WINDOW end`` lines mark the window so
the caller can sample the server's CPU and profile it over the same span.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

START_DELAY = 0.5  # seconds the workers get to start before the clock runs


@dataclass(slots=True)
class WorkerResult:
    ok: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # non-200 status -> count
    errors: int = 0  # connection errors, short reads, 200s with the wrong number of ids
    latencies: list[float] = field(default_factory=list)  # seconds, 200s in the window
    cpu: float = 0.0  # CPU seconds this worker used inside the window


def build_request(url: str, body: bytes, headers: dict[str, str]) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    return host, port, ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError("response without Content-Length")


async def _connection(
    host: str,
    port: int,
    request: bytes,
    lines: int,
    window: tuple[float, float],
    result: WorkerResult,
) -> None:
    begin, end = window
    clock = time.monotonic
    while clock() < end:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            if begin <= clock() < end:
                result.errors += 1
            await asyncio.sleep(0.05)
            continue
        try:
            while True:
                sent = clock()
                if sent >= end:
                    return
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                body = await reader.readexactly(_content_length(head))
                done = clock()
                if not begin <= done < end:
                    continue
                if status != 200:
                    key = str(status)
                    result.statuses[key] = result.statuses.get(key, 0) + 1
                elif body.count(b",") + 1 != lines:
                    result.errors += 1
                else:
                    result.ok += 1
                    result.latencies.append(done - sent)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            if begin <= clock() < end:
                result.errors += 1
        finally:
            writer.close()


async def _worker_main(
    url: str, body: bytes, headers: dict[str, str], conns: int, window: tuple[float, float]
) -> WorkerResult:
    host, port, request = build_request(url, body, headers)
    lines = body.rstrip(b"\n").count(b"\n") + 1
    result = WorkerResult()
    tasks = [
        asyncio.create_task(_connection(host, port, request, lines, window, result))
        for _ in range(conns)
    ]

    async def cpu_window() -> None:
        await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
        cpu0 = time.process_time()
        await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
        result.cpu = time.process_time() - cpu0

    await cpu_window()
    # connections finish the request in hand; a server that stops answering is cut off
    _, hung = await asyncio.wait(tasks, timeout=10.0)
    for task in hung:
        task.cancel()
    result.errors += len(hung)
    await asyncio.gather(*hung, return_exceptions=True)
    return result


def _worker(
    url: str,
    body: bytes,
    headers: dict[str, str],
    conns: int,
    window: tuple[float, float],
    out: multiprocessing.SimpleQueue[WorkerResult],
) -> None:
    out.put(asyncio.run(_worker_main(url, body, headers, conns, window)))


def run(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    procs: int,
    conns: int,
    warmup: float,
    duration: float,
) -> dict[str, object]:
    """Run the workers (forked from this process) and merge their results."""
    context = multiprocessing.get_context("fork")
    out: multiprocessing.SimpleQueue[WorkerResult] = context.SimpleQueue()
    begin = time.monotonic() + START_DELAY + warmup
    window = (begin, begin + duration)
    per_proc = [conns // procs + (1 if i < conns % procs else 0) for i in range(procs)]
    workers = [
        context.Process(target=_worker, args=(url, body, headers, n, window, out), daemon=True)
        for n in per_proc
        if n > 0
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(max(0.0, window[0] - time.monotonic()))
        print("WINDOW start", flush=True)
        time.sleep(max(0.0, window[1] - time.monotonic()))
        print("WINDOW end", flush=True)
        results = [out.get() for _ in workers]
        for worker in workers:
            worker.join(timeout=10)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    merged: dict[str, object] = {"duration": duration, "procs": len(workers), "conns": conns}
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    for r in results:
        for key, count in r.statuses.items():
            statuses[key] = statuses.get(key, 0) + count
        latencies.extend(r.latencies)
    latencies.sort()
    merged.update(
        ok=sum(r.ok for r in results),
        errors=sum(r.errors for r in results),
        statuses=statuses,
        cpu=sum(r.cpu for r in results),
    )
    if latencies:
        merged["p50_ms"] = latencies[len(latencies) // 2] * 1000
        merged["p99_ms"] = latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] * 1000
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    parser.add_argument("url")
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--header", action="append", default=[], help="Name: value")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--conns", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args(argv)
    with open(args.body_file, "rb") as f:
        body = f.read()
    headers = dict(h.split(": ", 1) for h in args.header)
    result = run(
        args.url,
        body,
        headers,
        procs=args.procs,
        conns=args.conns,
        warmup=args.warmup,
        duration=args.duration,
    )
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

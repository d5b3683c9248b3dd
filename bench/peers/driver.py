"""One peer queue (pgqueuer or procrastinate) in one role, for ``python -m bench --peers``.

Runs inside the peers' own virtual environment (``bench/peers/requirements.txt``),
started as a script by ``bench.peers.run``; it imports nothing of this project.
Each peer is used as its documentation shows: pgqueuer's ``Queries.enqueue``
(lists for batches) and ``PgQueuer.run`` over asyncpg connections, as its own
``tools/benchmark.py`` does; procrastinate's ``defer_async`` /
``batch_defer_async`` and ``App.run_worker_async`` over its psycopg pool.

``graphile_driver.mjs`` is its node twin for graphile-worker: the same roles,
arguments and result lines.

Roles (the result is one ``RESULT {json}`` line on stdout):

  install   create the peer's schema in an empty database
  enqueue   C connections, each enqueuing B jobs a call from --start-at for
            --seconds; counts the jobs of the calls that began and ended inside
  fill      N jobs in batches (--queue other: a queue no worker of the bench reads)
  work      prints READY, waits for SIGUSR1, then runs no-op jobs:
            --drain until the queue is empty, or --samples: until that many
            jobs ran, noting for each the time from its enqueue to its start
  paced     one job every 1/--rate seconds for --seconds, stamped with its
            enqueue time (the latency workload's producer)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

NOOP = "noop"
DEFAULT_QUEUE = "default"
OTHER_QUEUE = "other"

OnJob = Callable[[float], None]


class PgQueuerPeer:
    name = "pgqueuer"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conns: list[Any] = []
        self.queries: list[Any] = []
        self.workers: list[Any] = []

    async def open(self, conns: int) -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.conns = [await asyncpg.connect(self.dsn) for _ in range(conns)]
        self.queries = [Queries(AsyncpgDriver(c)) for c in self.conns]

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()

    async def install(self) -> None:
        await self.queries[0].install()

    async def enqueue(self, slot: int, n: int, queue: str = DEFAULT_QUEUE) -> None:
        entrypoint = NOOP if queue == DEFAULT_QUEUE else f"{NOOP}_{queue}"
        q = self.queries[slot]
        if n == 1:
            await q.enqueue(entrypoint, json.dumps({"t": time.time()}).encode(), 0)
        else:
            await q.enqueue([entrypoint] * n, [b"{}"] * n, [0] * n)

    async def work(self, *, concurrency: int, batch: int, drain: bool, on_job: OnJob) -> None:
        from pgqueuer import PgQueuer, types

        async def run(slot: int) -> None:
            pgq = PgQueuer(self.queries[slot].driver, queries=self.queries[slot])
            self.workers.append(pgq)

            @pgq.entrypoint(NOOP)
            async def noop(job: Any) -> None:
                stamp = json.loads(job.payload or b"{}").get("t")
                if stamp is not None:
                    on_job(stamp)

            mode = types.QueueExecutionMode.drain if drain else types.QueueExecutionMode.continuous
            await pgq.run(batch_size=batch, mode=mode)

        await asyncio.gather(*(run(slot) for slot in range(concurrency)))

    def stop(self) -> None:
        for pgq in self.workers:
            pgq.shutdown.set()


class ProcrastinatePeer:
    name = "procrastinate"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.on_job: OnJob | None = None
        self.worker: asyncio.Task[None] | None = None

    async def open(self, conns: int) -> None:
        import procrastinate

        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=self.dsn, min_size=conns, max_size=conns
            )
        )

        @self.app.task(name=NOOP, queue=DEFAULT_QUEUE)
        async def noop(t: float | None = None) -> None:
            if t is not None and self.on_job is not None:
                self.on_job(t)

        self.task = noop
        await self.app.open_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def install(self) -> None:
        await self.app.schema_manager.apply_schema_async()

    async def enqueue(self, slot: int, n: int, queue: str = DEFAULT_QUEUE) -> None:
        deferrer = self.task.configure(queue=queue)
        if n == 1:
            await deferrer.defer_async(t=time.time())
        else:
            await deferrer.batch_defer_async(*({} for _ in range(n)))

    async def work(self, *, concurrency: int, batch: int, drain: bool, on_job: OnJob) -> None:
        self.on_job = on_job
        self.worker = asyncio.create_task(
            self.app.run_worker_async(
                queues=[DEFAULT_QUEUE],
                concurrency=concurrency,
                wait=not drain,
                install_signal_handlers=False,
            )
        )
        try:
            await self.worker
        except asyncio.CancelledError:
            if not self.stopping:
                raise

    stopping = False

    def stop(self) -> None:
        self.stopping = True
        if self.worker is not None:
            self.worker.cancel()


PEERS = {"pgqueuer": PgQueuerPeer, "procrastinate": ProcrastinatePeer}


def result(**values: object) -> None:
    print("RESULT " + json.dumps(values), flush=True)


async def enqueue(peer: Any, args: argparse.Namespace) -> None:
    await peer.open(args.conns)
    try:
        end = args.start_at + args.seconds
        counted = 0

        async def loop(slot: int) -> None:
            nonlocal counted
            while True:
                began = time.time()
                if began >= end:
                    return
                await peer.enqueue(slot, args.batch)
                if began >= args.start_at and time.time() <= end:
                    counted += args.batch

        await asyncio.gather(*(loop(slot) for slot in range(args.conns)))
        result(jobs=counted, seconds=args.seconds)
    finally:
        await peer.close()


async def fill(peer: Any, args: argparse.Namespace) -> None:
    await peer.open(args.conns)
    try:
        left = args.jobs

        async def loop(slot: int) -> None:
            nonlocal left
            while left > 0:
                n = min(args.batch, left)
                left -= n
                await peer.enqueue(slot, n, args.queue)

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(slot) for slot in range(args.conns)))
        result(jobs=args.jobs, seconds=time.perf_counter() - t0)
    finally:
        await peer.close()


async def work(peer: Any, args: argparse.Namespace) -> None:
    await peer.open(max(2, args.concurrency + 1))
    latencies: list[float] = []
    seen = 0

    def on_job(stamp: float) -> None:
        nonlocal seen
        started = time.time()
        seen += 1
        if seen > args.warm:
            latencies.append(1000 * (started - stamp))
        if args.samples and len(latencies) >= args.samples:
            peer.stop()

    try:
        go = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
        print("READY", flush=True)
        await go.wait()
        await peer.work(
            concurrency=args.concurrency, batch=args.batch, drain=args.drain, on_job=on_job
        )
        result(latencies_ms=latencies, finished=time.time())
    finally:
        await peer.close()


async def paced(peer: Any, args: argparse.Namespace) -> None:
    await peer.open(4)
    try:
        every = 1.0 / args.rate
        start = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        for i in range(round(args.rate * args.seconds)):
            delay = start + i * every - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(peer.enqueue(i % 4, 1))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        result(jobs=round(args.rate * args.seconds))
    finally:
        await peer.close()


async def install(peer: Any, args: argparse.Namespace) -> None:
    await peer.open(1)
    try:
        await peer.install()
        result(installed=peer.name)
    finally:
        await peer.close()


ROLES = {"install": install, "enqueue": enqueue, "fill": fill, "work": work, "paced": paced}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--conns", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--queue", default=DEFAULT_QUEUE)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument("--warm", type=int, default=0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    peer = PEERS[args.peer](args.dsn)
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(ROLES[args.role](peer, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``capacity`` section: what a job costs the store and the daemon, in CPU
seconds per 1,000 jobs, for sizing a deployment (docs/deploy.md).

One daemon on a fresh database, a no-op python handler, ``--run-jobs`` jobs
(100,000; quick 10,000) in 1000-line POSTs. Four windows, each with the CPU of
the PostgreSQL server's processes (postmaster and every backend, autovacuum and
the WAL writer included), the daemon's own and its runner contexts':

- idle: nothing to do for a few seconds: what a daemon costs the store by
  being there (its leases, counts, schedules and samples);
- ingest: the jobs go to a type without a handler, first POST → the journal
  fully ingested (``/healthz`` ingest lag 0): the store's share is ingestion
  (COPY, waiting counts, NOTIFY), the daemon's the adds, journal and ingester;
- claim + archive: the handler is added and the jobs, all waiting, run →
  ``done_ok`` grew by the count (the contexts' cold start is in it);
- end to end: ``run1``'s measurement (adds and runs at once, warm contexts),
  where claims come in the smaller batches a live stream gives; then the same
  with three daemons on one store (``run3``), whose claims meet (not with
  ``--quick``).

Without the bench's own server (``--store``) the store's processes cannot be
seen and only the daemon's figures are given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from bench import daemon
from bench.api import Api
from bench.e2e import (
    POST_LINES,
    PY_NOOP,
    Cpu,
    _post_all,
    bulk_body,
    measure_throughput,
    postmaster_pid,
)
from bench.procs import BenchError
from bench.report import Row
from bench.runs import daemons

if TYPE_CHECKING:
    from bench.cli import Run

TYPE = "capacity_noop"
IDLE_S = 10.0  # CPU time is counted in ticks of 10 ms: an idle server needs a while
IDLE_S_QUICK = 2.0
POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Window:
    """CPU seconds each part used in one window, and how long it lasted."""

    name: str
    jobs: int
    seconds: float
    store: float | None  # None: the server's processes are not the bench's to see
    daemon: float
    contexts: float

    @classmethod
    def between(cls, name: str, jobs: int, a: Cpu, b: Cpu, *, store_seen: bool) -> Window:
        return cls(
            name=name,
            jobs=jobs,
            seconds=b.at - a.at,
            store=(b.postgres - a.postgres) if store_seen else None,
            daemon=b.daemons - a.daemons,
            contexts=b.contexts - a.contexts,
        )

    def per_1k(self, cpu: float) -> float:
        """CPU milliseconds per 1,000 jobs (``cpu`` in seconds)."""
        return 1e6 * cpu / self.jobs

    def describe(self) -> str:
        store = "n/a" if self.store is None else f"{self.per_1k(self.store):.1f}"
        return (
            f"{self.jobs:,} jobs in {self.seconds:.2f} s ({self.jobs / self.seconds:,.0f}/s); "
            f"CPU ms per 1,000 jobs: store {store}, daemon {self.per_1k(self.daemon):.1f}, "
            f"contexts {self.per_1k(self.contexts):.1f}"
        )


async def _until(probe: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise BenchError(f"capacity: {what} not within {within:.0f} s")
        await asyncio.sleep(POLL_S)


async def _ingested(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url + "/healthz") as reply:
        body = await reply.json(content_type=None)
    lag = body.get("ingest_lag", {}) if isinstance(body, dict) else {}
    return reply.status == 200 and lag.get("lines") == 0


async def _measure(
    url: str, token: str, pids: list[int], postmaster: int | None, jobs: int, idle: float
) -> list[Window]:
    seen = postmaster is not None

    def sample() -> Cpu:
        return Cpu.sample(pids, postmaster)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        api = Api(session, url, token, daemon.TENANT)
        await _until(lambda: _ingested(session, url), 60, "a ready daemon")
        a = sample()
        await asyncio.sleep(idle)  # the idle window is what is measured here
        idle_window = Window.between("idle", 1000, a, sample(), store_seen=seen)

        base = await api.stats(TYPE)
        a = sample()
        await _post_all([api], TYPE, bulk_body(POST_LINES), jobs // POST_LINES, 4)
        await _until(lambda: _ingested(session, url), 300, "ingestion")
        ingest = Window.between("ingest", jobs, a, sample(), store_seen=seen)

        a = sample()
        await api.add_handler(TYPE, "python", PY_NOOP)

        async def done() -> bool:
            counts = await api.stats(TYPE)
            if counts["done_failed"] or counts["done_error"]:
                raise BenchError(f"capacity: jobs failed: {counts}")
            return counts["done_ok"] - base["done_ok"] >= jobs

        await _until(done, max(120.0, jobs / 500), "every job done")
        claim = Window.between("claim+archive", jobs, a, sample(), store_seen=seen)
    return [idle_window, ingest, claim]


def _end_to_end(
    run: Run, name: str, urls: list[str], token: str, pids: list[int], postmaster: int | None
) -> Window:
    jobs = run.opts.run_jobs
    mixed = asyncio.run(
        measure_throughput(
            urls,
            token,
            daemon.TENANT,
            lang="python",
            jobs=jobs,
            warm=300 * len(urls),
            conns=run.opts.run_conns,
            poll=0.05,
            limit_s=max(120.0, jobs / 500),
            daemon_pids=pids,
            postmaster=postmaster,
            progress=False,
        )
    )
    return Window(
        name=name,
        jobs=jobs,
        seconds=mixed.seconds,
        store=mixed.cores["postgres"] * mixed.seconds if postmaster is not None else None,
        daemon=mixed.cores["daemon"] * mixed.seconds,
        contexts=mixed.cores["contexts"] * mixed.seconds,
    )


def section_capacity(run: Run) -> None:
    jobs = run.opts.run_jobs
    idle = IDLE_S_QUICK if run.opts.quick else IDLE_S
    with daemons(run, "capacity", 1) as (children, urls, token):
        postmaster = postmaster_pid(run.pg.pgdata if run.pg is not None else None)
        pids = [c.pid for c in children]
        print(f"  idle {idle:g} s, then {jobs:,} jobs ingested, then run ...", flush=True)
        idle_w, ingest, claim = asyncio.run(_measure(urls[0], token, pids, postmaster, jobs, idle))
        print(f"  ingest: {ingest.describe()}", flush=True)
        print(f"  claim+archive: {claim.describe()}", flush=True)
        print(f"  end to end, {jobs:,} jobs ...", flush=True)
        e2e = _end_to_end(run, "end to end", urls, token, pids, postmaster)
    print(f"  end to end: {e2e.describe()}", flush=True)
    # the store's cost per job as daemons are added (claims of several daemons meet);
    # not in a quick run, which only shows that the section works
    e2e3 = None
    if not run.opts.quick:
        with daemons(run, "capacity3", 3) as (children, urls, token):
            print(f"  end to end, 3 daemons, {jobs:,} jobs ...", flush=True)
            pids = [c.pid for c in children]
            e2e3 = _end_to_end(run, "end to end, 3 daemons", urls, token, pids, postmaster)
        print(f"  end to end, 3 daemons: {e2e3.describe()}", flush=True)
    _rows(run, idle_w, ingest, claim, e2e, e2e3)


def _rows(
    run: Run, idle: Window, ingest: Window, claim: Window, e2e: Window, e2e3: Window | None
) -> None:
    unit = "CPU ms/1k jobs"
    if e2e.store is not None and ingest.store is not None and claim.store is not None:
        run.rows.append(
            Row(
                "(capacity) store, ingest",
                ingest.per_1k(ingest.store),
                unit,
                notes=ingest.describe(),
            )
        )
        run.rows.append(
            Row(
                "(capacity) store, claim + archive",
                claim.per_1k(claim.store),
                unit,
                notes=claim.describe(),
            )
        )
        run.rows.append(
            Row(
                "(capacity) store, end to end",
                e2e.per_1k(e2e.store),
                unit,
                notes=f"{e2e.describe()}; one store core: "
                f"{1e6 / e2e.per_1k(e2e.store):,.0f} jobs/s",
            )
        )
        if e2e3 is not None and e2e3.store is not None:
            run.rows.append(
                Row(
                    "(capacity) store, end to end, 3 daemons",
                    e2e3.per_1k(e2e3.store),
                    unit,
                    notes=e2e3.describe(),
                )
            )
    else:
        run.rows.append(
            Row("(capacity) store", None, unit, notes="--store: the server's processes not seen")
        )
    run.rows.append(
        Row(
            "(capacity) daemon + contexts, ingest",
            ingest.per_1k(ingest.daemon + ingest.contexts),
            unit,
            notes="adds over HTTP, journal, ingester",
        )
    )
    run.rows.append(
        Row(
            "(capacity) daemon + contexts, claim + archive",
            claim.per_1k(claim.daemon + claim.contexts),
            unit,
            notes=f"daemon {claim.per_1k(claim.daemon):.1f}, "
            f"contexts {claim.per_1k(claim.contexts):.1f}",
        )
    )
    total = e2e.daemon + e2e.contexts
    run.rows.append(
        Row(
            "(capacity) daemon + contexts, end to end",
            e2e.per_1k(total),
            unit,
            notes=f"daemon {e2e.per_1k(e2e.daemon):.1f}, contexts "
            f"{e2e.per_1k(e2e.contexts):.1f}; one core: {1e6 / e2e.per_1k(total):,.0f} jobs/s",
        )
    )
    store_idle = "n/a" if idle.store is None else f"{1000 * idle.store / idle.seconds:.1f}"
    run.rows.append(
        Row(
            "(capacity) idle daemon, its own CPU",
            1000 * (idle.daemon + idle.contexts) / idle.seconds,
            "CPU ms/s",
            notes=f"the store's CPU for it: {store_idle} ms/s ({idle.seconds:.1f} s idle; "
            "CPU is counted in 10 ms ticks)",
        )
    )

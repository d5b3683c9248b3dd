"""The sections that measure adds and their ceilings: ``fsync``, ``copy``, ``bare``,
``add1``, ``add1000``, ``ingest`` (see ``bench.cli``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from bench import ceilings, daemon
from bench.http_load import Load, LoadResult, run_load
from bench.procs import Child, python
from bench.report import Row

if TYPE_CHECKING:
    from bench.cli import Run

COPY_BATCHES = [1000, 5000, 10000]
INGEST_BATCHES = [1000, 5000, 10000]
ADD_TARGET = 100_000.0  # jobs/s with 1000-line POSTs
INGEST_TARGET = 60_000.0  # rows/s journal → store
ONE_LINE = b'{"bench": 1, "pad": "0123456789abcdef"}\n'


def _bulk_body(lines: int) -> bytes:
    return b"".join(b'{"bench": %d, "pad": "0123456789abcdef"}\n' % i for i in range(lines))


def section_fsync(run: Run) -> None:
    rate, mean_ms = ceilings.fsync_ceiling(run.work, run.opts.fsync_seconds)
    run.fsync_rate = rate
    run.rows.append(
        Row(
            "(1) fdatasync, append+sync loop",
            rate,
            "syncs/s",
            "ceiling",
            notes=f"{mean_ms:.3f} ms each (DESIGN: ~0.2 ms)",
        )
    )


def section_copy(run: Run) -> None:
    dsn = run.fresh_database("copy")
    rates = asyncio.run(ceilings.copy_ceilings(dsn, run.opts.copy_rows, COPY_BATCHES))
    run.copy_rates = rates
    design = {1000: " (DESIGN: ~120k)", 10000: " (DESIGN: ~157k)"}
    for batch, rate in rates.items():
        run.rows.append(
            Row(
                f"(2) COPY, batches of {batch:,}",
                rate,
                "rows/s",
                "ceiling",
                notes=f"{run.opts.copy_rows:,} rows, temp table, no index{design.get(batch, '')}",
            )
        )
    indexed = asyncio.run(ceilings.copy_into_jobs_like(dsn, run.opts.copy_rows, COPY_BATCHES))
    run.copy_indexed = indexed
    for batch, rate in indexed.items():
        run.rows.append(
            Row(
                f"(2i) COPY into a jobs-like table, {batch:,}",
                rate,
                "rows/s",
                f"(2) COPY@{batch:,}",
                rate / rates[batch],
                "logged, with the jobs indexes, a commit per batch: PostgreSQL's share",
            )
        )


def measure_loads(run: Run, targets: list[tuple[str, Child, Load]]) -> list[tuple[LoadResult, str]]:
    """``--repeat`` rounds over the targets, alternating (the machine is shared, so
    servers compared by a ratio see the same background load); the best of each
    target's loads, with notes. py-spy, if asked, records each target's first load."""
    profilers = [run.profiler(name) for name, _, _ in targets]
    results: list[list[LoadResult]] = [[] for _ in targets]
    for round_ in range(run.opts.repeat):
        for i, (_, server, load) in enumerate(targets):
            profiler = profilers[i] if round_ == 0 else None
            results[i].append(run_load(run.generator, load, server, run.work, profiler=profiler))
            load.warmup = min(load.warmup, 0.5)
    out = []
    for (name, _, load), profiler, tries in zip(targets, profilers, results, strict=True):
        if profiler is not None:
            run.profiles.append((name, profiler.summary))
        best = max(tries, key=lambda r: r.jobs_per_s)
        notes = f"{load.conns} conns, {best.describe()}"
        if len(tries) > 1:
            figures = ", ".join(f"{r.requests_per_s:,.0f}" for r in tries)
            notes = f"best of {len(tries)} ({figures} POSTs/s); {notes}"
        failures = sum(r.failures for r in tries)
        if failures and not best.failures:
            notes += f"; {failures} NON-200/errors in the other runs"
        out.append((best, notes))
    return out


@contextmanager
def _bare_server(run: Run) -> Iterator[tuple[Child, Load]]:
    argv = python("-m", "bench.bare_server", "--file", str(run.work / "bare.log"))
    server = Child("bare_server", argv, log_dir=run.work)
    try:
        url = server.wait_line("listening on ", timeout=30).split("listening on ", 1)[1]
        yield server, run.load(url + "/bench/job/bench_add/add", ONE_LINE, {}, run.opts.conns)
    finally:
        server.stop(grace=5)


@contextmanager
def adds_daemon(run: Run, name: str) -> Iterator[tuple[Child, str, str]]:
    """A fresh daemon (own data dir) on the bench database; yields (child, url, token)."""
    data_dir = run.work / name
    data_dir.mkdir()
    if run.daemon_dsn is None or run.daemon_token is None:
        run.daemon_dsn = run.fresh_database("daemon")
        run.daemon_token = daemon.add_tenant(run.daemon_dsn, data_dir)
    dsn, token = run.daemon_dsn, run.daemon_token
    child, url = daemon.start_daemon(name, dsn, data_dir, run.work)
    try:
        yield child, url, token
    finally:
        child.stop(grace=20)


def add_url(url: str) -> str:
    return f"{url}/{daemon.TENANT}/job/{daemon.JOBTYPE}/add"


def _bare_row(run: Run, result: LoadResult, notes: str) -> None:
    run.bare_rate = result.requests_per_s
    run.rows.append(
        Row(
            "(3) bare aiohttp + group fsync, 1-line",
            result.requests_per_s,
            "POSTs/s",
            "ceiling",
            notes=notes + " (DESIGN: ~8-10k)",
        )
    )


def _add1_row(run: Run, result: LoadResult, notes: str) -> None:
    ratio = None if run.bare_rate is None else result.jobs_per_s / run.bare_rate
    run.rows.append(
        Row(
            "(4a) daemon, 1-line POSTs",
            result.jobs_per_s,
            "jobs/s",
            "(3) bare aiohttp",
            ratio,
            notes,
        )
    )


def section_bare(run: Run) -> None:
    """(3), and (4a) too when it is asked for: both servers up, loads alternating."""
    with _bare_server(run) as (bare, bare_load):
        if "add1" not in run.opts.sections:
            ((result, notes),) = measure_loads(run, [("bare", bare, bare_load)])
            _bare_row(run, result, notes)
            return
        with adds_daemon(run, "daemon_add1") as (child, url, token):
            headers = {"Authorization": f"Bearer {token}"}
            load = run.load(add_url(url), ONE_LINE, headers, run.opts.conns)
            (bare_result, bare_notes), (result, notes) = measure_loads(
                run, [("bare", bare, bare_load), ("add1", child, load)]
            )
    _bare_row(run, bare_result, bare_notes)
    _add1_row(run, result, notes)
    run.add1_done = True


def section_add1(run: Run) -> None:
    if run.add1_done:  # measured with (3), alternating
        return
    with adds_daemon(run, "daemon_add1") as (child, url, token):
        headers = {"Authorization": f"Bearer {token}"}
        load = run.load(add_url(url), ONE_LINE, headers, run.opts.conns)
        ((result, notes),) = measure_loads(run, [("add1", child, load)])
    _add1_row(run, result, notes)


def section_add1000(run: Run) -> None:
    body = _bulk_body(1000)
    with adds_daemon(run, "daemon_add1000") as (child, url, token):
        headers = {"Authorization": f"Bearer {token}"}
        load = run.load(add_url(url), body, headers, run.opts.bulk_conns)
        ((result, notes),) = measure_loads(run, [("add1000", child, load)])
        assert run.daemon_dsn is not None
        drained = daemon.drain_report(url, run.daemon_dsn, 10.0 if run.opts.quick else 60.0)
    run.rows.append(
        Row(
            "(4b) daemon, 1000-line POSTs",
            result.jobs_per_s,
            "jobs/s",
            "target 100k/s",
            result.jobs_per_s / ADD_TARGET,
            f"{notes}; {drained}",
        )
    )


def section_ingest(run: Run) -> None:
    from bench.ingest import measure_ingest

    rows = run.opts.ingest_rows
    workers = run.opts.ingest_workers
    for batch in INGEST_BATCHES:
        dsn = run.fresh_database(f"ingest_{batch}")
        directory = run.work / f"journal-ingest-{batch}"
        result = asyncio.run(
            measure_ingest(dsn, directory, rows=rows, batch=batch, workers=workers, limit_s=120.0)
        )
        ceiling = run.copy_rates.get(batch)
        indexed = run.copy_indexed.get(batch)
        indexed_note = "" if indexed is None else f"vs (2i): {result.rows_per_s / indexed:.2f}; "
        run.rows.append(
            Row(
                f"(5) ingest, batch {batch:,}",
                result.rows_per_s,
                "rows/s",
                f"(2) COPY@{batch:,}",
                None if ceiling is None else result.rows_per_s / ceiling,
                f"{rows:,} rows, {workers} workers; target 60k: "
                f"{result.rows_per_s / INGEST_TARGET:.2f}; "
                f"{indexed_note}journal filled at "
                f"{rows / result.write_seconds:,.0f} lines/s",
            )
        )

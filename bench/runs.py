"""The sections that run jobs: ``claim``, ``coldstart``, ``latency``, ``flood``, ``run1``, ``run3``.

Each end-to-end measurement gets a fresh database, a tenant and its own
daemons (separate data dirs, one DSN), stopped again at the end of it.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bench import daemon
from bench.claim import claim_cost
from bench.e2e import Latency, Throughput, measure_latency, measure_throughput, postmaster_pid
from bench.procs import BenchError, Child
from bench.report import Row
from queue_daemon.store.embedded import stop_server

if TYPE_CHECKING:
    from bench.cli import Run
    from bench.flood import Turns

RUN_TARGET = 12_000.0  # jobs/s end to end, no-op handler
LATENCY_TARGET_MS = 20.0  # p50, add → start on an idle daemon
FLOOD_TARGET_RATIO = 2.0  # a flooding tenant may at most double another's add → start
FLOOD_TENANT = "flood"  # the bench's own tenant is the calm one
FLOOD_ROUNDS = 10  # turns of the flood off and on (bench.flood), after the idle → flooded pair
CLAIM_TARGET_RATIO = 1.5
CLAIM_SIZES = (10_000, 100_000, 1_000_000)
CLAIM_SIZES_QUICK = (10_000, 100_000)
DESIGN_SPAWN_MS = {"python": 17.0, "node": 85.0}
LANGS = ("python", "node")
RUN_LANGS = (*LANGS, "wasm")  # end to end: wasm no-op jobs too


@contextmanager
def daemons(run: Run, name: str, count: int) -> Iterator[tuple[list[Child], list[str], str]]:
    """``count`` daemons on one fresh database (own data dirs); (children, urls, token)."""
    dsn = run.fresh_database(name)
    dirs = [run.work / f"{name}-{i}" for i in range(count)]
    for directory in dirs:
        directory.mkdir()
    token = daemon.add_tenant(dsn, dirs[0])
    children: list[Child] = []
    urls: list[str] = []
    with ExitStack() as stack:
        for i, directory in enumerate(dirs):
            child, url = daemon.start_daemon(
                f"{name}-{i}", dsn, directory, run.work, extra=run.opts.daemon_args
            )
            stack.callback(child.stop, grace=20)
            children.append(child)
            urls.append(url)
        yield children, urls, token


def _throughput(run: Run, section: str, lang: str, count: int) -> Throughput:
    name = f"{section}_{lang}"
    with daemons(run, name, count) as (children, urls, token):
        profiler = run.profiler(name, subprocesses=True) if count == 1 else None
        jobs = run.opts.run_jobs
        print(f"  {lang}: {count} daemon(s), {jobs:,} jobs ...", flush=True)
        postmaster = postmaster_pid(run.pg.pgdata if run.pg is not None else None)
        coro = measure_throughput(
            urls,
            token,
            daemon.TENANT,
            lang=lang,
            jobs=jobs,
            warm=300 * count,
            conns=run.opts.run_conns,
            poll=0.05,
            limit_s=max(120.0, jobs / 500),
            daemon_pids=[c.pid for c in children],
            postmaster=postmaster,
            profile=(lambda: profiler.start(children[0].pid, 600)) if profiler else None,
        )
        try:
            result = asyncio.run(coro)
        except BenchError as exc:
            dead = [
                f"{c.name} exited {c.proc.returncode}"
                for c in children
                if c.proc.poll() is not None
            ]
            tails = "\n".join(c.log_tail(5) for c in children)
            raise BenchError(f"{exc}{'; ' + ', '.join(dead) if dead else ''}\n{tails}") from None
        finally:
            if profiler is not None:
                profiler.stop()
                run.profiles.append((name, profiler.summary))
    print(f"  {lang}: {result.rate:,.0f} jobs/s; {result.describe()}", flush=True)
    return result


def _run_section(run: Run, section: str, count: int) -> None:
    for lang in RUN_LANGS:
        label = f"({section}) {count} daemon{'s' if count > 1 else ''}, {lang} no-op"
        try:
            result = _throughput(run, section, lang, count)
        except BenchError as exc:
            first = str(exc).splitlines()[0][:300]
            print(f"bench: {section} {lang} failed: {exc}", flush=True)
            run.rows.append(Row(label, None, "jobs/s", notes=first))
            run.failed = True
            continue
        profiled = " (py-spy attached)" if run.opts.profile is not None and count == 1 else ""
        run.rows.append(
            Row(
                label,
                result.rate,
                "jobs/s",
                "target 12k/s",
                result.rate / RUN_TARGET,
                f"{result.describe()}{profiled}",
            )
        )


def section_run1(run: Run) -> None:
    _run_section(run, "run1", 1)


def section_run3(run: Run) -> None:
    _run_section(run, "run3", 3)


def section_latency(run: Run) -> None:
    samples = run.opts.latency_samples
    with daemons(run, "latency", 1) as (_, urls, token):
        result: Latency = asyncio.run(
            measure_latency(urls[0], token, daemon.TENANT, samples=samples, warm=5)
        )
    p50, p99 = Latency.pct(result.starts_ms, 0.5), Latency.pct(result.starts_ms, 0.99)
    notes = (
        f"{samples} jobs one at a time, python handler; POST→200 p50 "
        f"{Latency.pct(result.acks_ms, 0.5):.1f} ms; POST→seen done (polled every 2 ms) p50 "
        f"{Latency.pct(result.seen_ms, 0.5):.1f} ms"
    )
    run.rows.append(
        Row(
            "(latency) add → start, p50",
            p50,
            "ms",
            "target <= 20 ms",
            p50 / LATENCY_TARGET_MS,
            notes,
        )
    )
    run.rows.append(
        Row(
            "(latency) add → start, p99",
            p99,
            "ms",
            "",
            None,
            f"min {min(result.starts_ms):.1f} ms, max {max(result.starts_ms):.1f} ms",
        )
    )


@dataclass(frozen=True, slots=True)
class FloodKind:
    name: str  # in the row labels
    handler: str  # the flood's python source
    describe: str  # its jobs, for the notes
    saturate: int  # flood jobs running at once when the flood is on
    warmed: int  # flood jobs done before measuring (the daemon learned their run time)
    realtime: bool = False  # the daemon started with ``serve --realtime``


def _flood_kinds(quick: bool) -> list[FloodKind]:
    from bench.flood import busy_handler, sleepy_handler

    cpu = FloodKind("CPU flood", busy_handler(20.0), "jobs of 20 ms CPU", 4, 20 if quick else 50)
    # 1 s each, one per batch: the daemon runs as many at once as it may run contexts
    slots = FloodKind("context flood", sleepy_handler(1.0), "jobs idle 1 s", 48, 8)
    if quick:
        return [cpu]
    # each way, so operators can choose: the default, and the daemon's place real-time
    # while a tenant is busy (serve --realtime)
    return [
        kind
        for plain in (cpu, slots)
        for kind in (plain, replace(plain, name=f"{plain.name} (--realtime)", realtime=True))
    ]


def section_flood(run: Run) -> None:
    """Each kind of flood on a daemon of its own (fresh database, data dir, contexts)."""
    for kind in _flood_kinds(run.opts.quick):
        print(f"  {kind.name}:", flush=True)
        try:
            _flood(run, kind)
        except BenchError as exc:
            print(f"bench: flood ({kind.name}) failed: {exc}", flush=True)
            run.rows.append(Row(f"(flood) {kind.name}", None, "", notes=str(exc).splitlines()[0]))
            run.failed = True


def _flood(run: Run, kind: FloodKind) -> None:
    from bench.flood import DiskProbe, measure_flood

    quick = run.opts.quick
    samples = run.opts.flood_samples
    name = "flood_" + kind.name.split()[0].lower() + ("_rt" if kind.realtime else "")
    # the default deployment: the daemon's own embedded PostgreSQL, which it starts in
    # its CPU place, sharing its weight (with --store, that server, wherever it runs)
    dsn = None if run.opts.store is None else run.fresh_database(name)
    data_dir = run.work / name
    data_dir.mkdir()
    try:
        calm_token = daemon.add_tenant(dsn, data_dir)
        flood_token = daemon.add_tenant(dsn, data_dir, FLOOD_TENANT)
        extra = [*run.opts.daemon_args, *(["--realtime"] if kind.realtime else [])]
        child, url = daemon.start_daemon(name, dsn, data_dir, run.work, extra=extra)
    except BaseException:
        stop_server(data_dir / "pg")  # nothing there with --store
        raise
    try:
        with DiskProbe(data_dir) as disk:
            result = asyncio.run(
                measure_flood(
                    url,
                    (FLOOD_TENANT, flood_token),
                    (daemon.TENANT, calm_token),
                    backlog=run.opts.flood_backlog,
                    post_lines=500 if quick else 1000,
                    add_rate=1_000.0 if quick else 2_000.0,
                    handler=kind.handler,
                    samples=samples,
                    warm=2 if quick else 5,
                    pause=0.03,
                    saturate=kind.saturate,
                    warmed=kind.warmed,
                    disk=disk,
                    rounds=2 if quick else FLOOD_ROUNDS,
                )
            )
    finally:
        child.stop(grace=20)
        stop_server(data_dir / "pg")  # the daemon stopped its server, unless it died
    base, flooded = result.baseline.starts_ms, result.flooded.starts_ms
    before, after = result.before, result.after
    flood_note = (
        f"flood tenant: {result.backlog:,} {kind.describe} queued, {result.added:,} more "
        f"added during the {result.seconds:.1f} s measured; running "
        f"{before['running']}→{after['running']}, waiting {before['waiting']:,}→"
        f"{after['waiting']:,}, {result.flood_done:,} done"
    )
    worst = _ratio_rows(
        run,
        f"(flood) {kind.name}: calm add → start",
        ("idle", base),
        flooded,
        (
            flood_note,
            f"{samples} calm jobs one at a time, each way; under the flood min "
            f"{min(flooded):.1f} ms, max {max(flooded):.1f} ms, POST→200 p50 "
            f"{Latency.pct(result.flooded.acks_ms, 0.5):.1f} ms (idle "
            f"{Latency.pct(result.baseline.acks_ms, 0.5):.1f} ms)",
        ),
    )
    idle_disk, busy_disk = result.disk_idle, result.disk_flooded
    if idle_disk and busy_disk:
        run.rows.append(
            Row(
                f"(flood) {kind.name}: the disk's fdatasync p99 meanwhile",
                Latency.pct(busy_disk, 0.99),
                "ms",
                f"idle {Latency.pct(idle_disk, 0.99):.1f} ms",
                None,
                f"a small append + fdatasync every 20 ms beside the daemon: max "
                f"{max(busy_disk):.1f} ms flooded, {max(idle_disk):.1f} ms idle; over 10 ms "
                f"{_over(busy_disk, 10)} flooded, {_over(idle_disk, 10)} idle (each ack "
                "waits for one, each ingest and claim for a WAL flush)",
            )
        )
    store = "the daemon's embedded PostgreSQL" if dsn is None else "the --store server"
    _worst_row(
        run,
        f"(flood) {kind.name}: flooded / idle, worst of p50, p99",
        worst,
        f"a tenant's flood must not raise another's add → start by more than 2x; store: {store}",
    )
    if result.turns is not None:
        _turn_rows(run, kind, result.turns)


def _turn_rows(run: Run, kind: FloodKind, turns: Turns) -> None:
    """The rows of the flood off and on in turns (see ``bench.flood``)."""
    off = "off: the flood's handler deleted and its adds stopped, its backlog queued"
    disk = (
        f"{turns.rounds} rounds, {len(turns.on.starts_ms)} calm jobs each way; the disk's "
        f"fdatasync p99 {Latency.pct(turns.disk_on, 0.99):.1f} ms on, "
        f"{Latency.pct(turns.disk_off, 0.99):.1f} ms off"
        if turns.disk_on and turns.disk_off
        else off
    )
    worst = _ratio_rows(
        run,
        f"(flood) {kind.name} on / off in turns: calm add → start",
        ("off", turns.off.starts_ms),
        turns.on.starts_ms,
        (off, disk),
    )
    _worst_row(
        run,
        f"(flood) {kind.name} on / off in turns, worst of p50, p99",
        worst,
        "the same comparison with both sides under the same disk weather",
    )


def _ratio_rows(
    run: Run,
    label: str,
    base: tuple[str, list[float]],
    busy: list[float],
    notes: tuple[str, str],
) -> float:
    """A p50 and a p99 row of ``busy`` against ``base`` (its name and samples), with
    ``notes`` for each; returns the worse of the two ratios."""
    name, calm = base
    ratios = []
    for (pct, q), note in zip((("p50", 0.5), ("p99", 0.99)), notes, strict=True):
        was, now = Latency.pct(calm, q), Latency.pct(busy, q)
        ratios.append(now / was)
        run.rows.append(Row(f"{label} {pct}", now, "ms", f"{name} {was:.1f} ms", now / was, note))
    return max(ratios)


def _worst_row(run: Run, label: str, worst: float, note: str) -> None:
    run.rows.append(Row(label, worst, "x", "target <= 2", worst / FLOOD_TARGET_RATIO, note))


def _over(times: list[float], ms: float) -> str:
    return f"{sum(1 for t in times if t > ms)}/{len(times)}"


def section_claim(run: Run) -> None:
    sizes = CLAIM_SIZES_QUICK if run.opts.quick else CLAIM_SIZES
    results = asyncio.run(claim_cost(run.admin_dsn(), sizes))
    for size, ms, rate in results:
        run.rows.append(
            Row(
                f"(claim) claim+archive at {size:,} waiting",
                ms,
                "ms/100",
                "",
                None,
                f"batches of 100, one connection: {rate:,.0f} jobs/s; as many archived rows",
            )
        )
    first, last = results[0], results[-1]
    run.rows.append(
        Row(
            f"(claim) cost {last[0]:,} / {first[0]:,}",
            last[1] / first[1],
            "x",
            "target <= 1.5",
            (last[1] / first[1]) / CLAIM_TARGET_RATIO,
            "DESIGN: the cost of a claim must not grow with the depth of the queue",
        )
    )


def section_coldstart(run: Run) -> None:
    from bench.coldstart import measure, measure_wasm

    for result in measure(run.work / "coldstart", LANGS, rounds=5):
        spread = ", ".join(f"{ms:.0f}" for ms in result.cold_ms)
        run.rows.append(
            Row(
                f"(coldstart) {result.lang} context, spawn → ready",
                result.median,
                "ms",
                f"bare {result.lang} spawn",
                result.median / result.bare,
                f"median of 5 ({spread} ms); warm 1-job batch "
                f"{statistics.median(result.warm_ms):.1f} ms; bare interpreter spawn→exit "
                f"{result.bare:.0f} ms (DESIGN: ~{DESIGN_SPAWN_MS[result.lang]:.0f} ms)"
                + (f"; {result.note}" if result.note else ""),
            )
        )
    run.rows += [wasm.row() for wasm in measure_wasm(run.work / "coldstart-wasm", rounds=5)]

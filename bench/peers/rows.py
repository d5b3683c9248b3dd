"""The measured rows of ``python -m bench --peers``: each workload run for this
project and each peer, on a settled server, in turns where a row repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.peers import ours
from bench.peers.report import Row, number
from bench.procs import BenchError

if TYPE_CHECKING:
    from bench.cli import Run
    from bench.peers.run import PeerRunner


@dataclass(frozen=True, slots=True)
class Sizes:
    jobs: int
    backlog: int
    latency_rate: float
    latency_s: float
    latency_warm_s: float

    @staticmethod
    def of(quick: bool) -> Sizes:
        if quick:
            return Sizes(10_000, 100_000, 100.0, 5.0, 1.0)
        return Sizes(100_000, 1_000_000, 100.0, 20.0, 2.0)


def _measure(run: Run, label: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a settled server (``Run.settle``: the databases
    of earlier phases dropped, their autovacuum with them, a checkpoint), or
    None (printed) when it failed."""
    run.settle()
    t0 = time.monotonic()
    try:
        value = fn(*args, **kwargs)
    except BenchError as exc:
        print(f"  {label}: FAILED: {str(exc)[:2000]}", flush=True)
        return None
    print(f"  {label}: {_shown(value)} ({time.monotonic() - t0:.0f} s)", flush=True)
    return value


def _shown(value: Any) -> str:
    if isinstance(value, ours.Figure):
        return f"{number(value.value)}; {value.notes}" if value.notes else number(value.value)
    if isinstance(value, tuple):
        return "; ".join(number(v) if isinstance(v, float) else str(v) for v in value)
    return number(value) if isinstance(value, float) else str(value)


def measure(run: Run, peers: Sequence[PeerRunner], sizes: Sizes) -> list[Row]:
    conns, bulk = run.opts.conns, run.opts.bulk_conns
    rows: list[Row] = []

    for batch in (1, 1000):
        row = Row(f"enqueue, {batch:,} a call", "jobs/s", True)
        lines_conns = conns if batch == 1 else bulk
        http = _measure(
            run, f"this project, HTTP, {batch}", ours.enqueue_http, run, batch, lines_conns
        )
        writers = 64 if batch == 1 else 8
        journal = _measure(
            run, f"this project, journal, {batch}", ours.enqueue_journal, run, batch, writers
        )
        row.ours = None if http is None else http.value
        row.notes.append(f"this project: HTTP POSTs of {batch:,} line(s), {lines_conns} conns")
        if journal is not None:
            row.notes.append(
                f"journal path without HTTP: {journal.value:,.0f} jobs/s ({journal.notes})"
            )
        for peer in peers:
            found = _measure(run, f"{peer.name}, {batch}", peer.enqueue, batch)
            row.peers[peer.name] = None if found is None else found[0]
            if found is not None:
                row.notes.append(f"{peer.name}: {found[1]}")
        rows.append(row)

    for peer in peers:
        peer.tuned = _measure(run, f"{peer.name}, worker shapes", peer.tune, run.opts.quick) or ""
    rows.append(_e2e_row(run, peers, sizes, 0))
    rows.extend(_latency_rows(run, peers, sizes))
    rows.append(_e2e_row(run, peers, sizes, sizes.backlog))
    return rows


def _e2e_row(run: Run, peers: Sequence[PeerRunner], sizes: Sizes, backlog: int) -> Row:
    """The best of ``--repeat`` end to ends (of one, with a backlog), this project
    and the peers in turn; a peer below half this project's first rate runs once."""
    what = "e2e" if not backlog else f"e2e, {backlog:,} waiting in another queue"
    row = Row(f"{what} ({sizes.jobs:,} no-op jobs)", "jobs/s", True)
    repeat = 1 if backlog else max(1, run.opts.repeat)
    names = ["this project", *(peer.name for peer in peers)]
    rates: dict[str, list[float]] = {name: [] for name in names}
    best: dict[str, tuple[float, str]] = {}
    for turn in range(repeat):
        for name, peer in zip(names, [None, *peers], strict=True):
            if turn and name != "this project" and not _contender(rates, name):
                continue  # failed, or far behind: its one figure stands
            if peer is None:
                figure = _measure(
                    run, f"{name}, {what}", ours.e2e, run, sizes.jobs, backlog=backlog
                )
                found = None if figure is None else (figure.value, figure.notes)
            else:
                found = _measure(run, f"{name}, {what}", peer.e2e, sizes.jobs, backlog)
            if found is None:
                continue
            rates[name].append(found[0])
            if name not in best or found[0] > best[name][0]:
                best[name] = found
    for name in names:
        rate, note = best.get(name, (None, ""))
        if name == "this project":
            row.ours = rate
        else:
            row.peers[name] = rate
        if rate is not None:
            tries = rates[name]
            seen = f"best of {len(tries)} ({', '.join(f'{r:,.0f}' for r in tries)}): " * (
                len(tries) > 1
            )
            row.notes.append(f"{name}: {seen}{note}")
    return row


def _contender(rates: dict[str, list[float]], name: str) -> bool:
    """A peer whose first end to end reached half this project's first."""
    own, first = rates["this project"], rates[name]
    return bool(first) and (not own or 2 * first[0] >= own[0])


def _latency_rows(run: Run, peers: Sequence[PeerRunner], sizes: Sizes) -> list[Row]:
    """The median p50 and p99 of ``--repeat`` runs, this project and the peers in
    turn (a machine that slows for a while slows each of them once); a peer whose
    first p50 is above twice this project's runs once."""
    what = f"add → start at {sizes.latency_rate:g} jobs/s"
    p50 = Row(f"{what}, p50", "ms", False)
    p99 = Row(f"{what}, p99", "ms", False)
    args = (sizes.latency_rate, sizes.latency_s, sizes.latency_warm_s)
    names = ["this project", *(peer.name for peer in peers)]
    tries: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for turn in range(max(1, run.opts.repeat)):
        for name, peer in zip(names, [None, *peers], strict=True):
            own, first = tries["this project"], tries[name]
            if (
                turn
                and name != "this project"
                and (not first or (own and first[0][0] > 2 * own[0][0]))
            ):
                continue  # failed, or far behind: its one figure stands
            if peer is None:
                found = _measure(run, f"{name}, {what}", ours.latency, run, *args)
            else:
                found = _measure(run, f"{name}, {what}", peer.latency, *args)
            if found is not None:
                tries[name].append(found)
    for name in names:
        runs = tries[name]
        middle = (
            (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
            if runs
            else (None, None)
        )
        if name == "this project":
            p50.ours, p99.ours = middle
        else:
            p50.peers[name], p99.peers[name] = middle
        if len(runs) > 1:
            for row, i in ((p50, 0), (p99, 1)):
                each = ", ".join(f"{t[i]:.2f}" for t in runs)
                row.notes.append(f"{name}: median of {len(runs)} ({each})")
    return [p50, p99]

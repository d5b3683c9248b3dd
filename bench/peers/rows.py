"""The measured rows of ``python -m bench --peers``: each workload run for this
project and each peer, on a settled server, in turns where a row repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
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
        if quick:  # a drain of 10,000 lasted 0.2 s: too short to say which system leads
            return Sizes(30_000, 100_000, 100.0, 5.0, 1.0)
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


OURS = "this project"


def _in_turns(
    run: Run,
    peers: Sequence[PeerRunner],
    turns: int,
    what: str,
    measure_ours: Callable[[], Any],
    measure_peer: Callable[[PeerRunner], Any],
    close: Callable[[Any, Any], bool],
) -> dict[str, list[Any]]:
    """Each system's figures of ``turns`` turns, this project then each peer (a
    machine that slows for a while slows each of them once). After the first
    turn a peer runs again only while ``close(its first, this project's first)``:
    a failed or far-behind peer's one figure stands."""
    systems: list[tuple[str, PeerRunner | None]] = [(OURS, None), *((p.name, p) for p in peers)]
    tries: dict[str, list[Any]] = {name: [] for name, _ in systems}
    for turn in range(turns):
        for name, peer in systems:
            own, first = tries[OURS], tries[name]
            if turn and peer is not None and (not first or (own and not close(first[0], own[0]))):
                continue
            label = f"{name}, {what}"
            if peer is None:
                found = _measure(run, label, measure_ours)
            else:
                found = _measure(run, label, measure_peer, peer)
            if found is not None:
                tries[name].append(found)
    return tries


def _e2e_row(run: Run, peers: Sequence[PeerRunner], sizes: Sizes, backlog: int) -> Row:
    """The best of ``--repeat`` end to ends (of one, with a backlog), this project
    and the peers in turn; a peer below half this project's first rate runs once."""
    what = "e2e" if not backlog else f"e2e, {backlog:,} waiting in another queue"
    row = Row(f"{what} ({sizes.jobs:,} no-op jobs)", "jobs/s", True)
    tries = _in_turns(
        run,
        peers,
        1 if backlog else max(1, run.opts.repeat),
        what,
        lambda: _figure(ours.e2e(run, sizes.jobs, backlog=backlog)),
        lambda peer: peer.e2e(sizes.jobs, backlog),
        lambda first, own: 2 * first[0] >= own[0],
    )
    for name, found in tries.items():
        if not found:
            rate = None
        else:
            rate, note = max(found, key=lambda f: f[0])
            seen = f"best of {len(found)} ({', '.join(f'{f[0]:,.0f}' for f in found)}): "
            row.notes.append(f"{name}: {seen * (len(found) > 1)}{note}")
        if name == OURS:
            row.ours = rate
        else:
            row.peers[name] = rate
    return row


def _figure(figure: ours.Figure) -> tuple[float, str]:
    return figure.value, figure.notes


def _latency_rows(run: Run, peers: Sequence[PeerRunner], sizes: Sizes) -> list[Row]:
    """The median p50 and p99 of ``--repeat`` runs, this project and the peers in
    turn; a peer whose first p50 is above twice this project's runs once."""
    what = f"add → start at {sizes.latency_rate:g} jobs/s"
    p50 = Row(f"{what}, p50", "ms", False)
    p99 = Row(f"{what}, p99", "ms", False)
    args = (sizes.latency_rate, sizes.latency_s, sizes.latency_warm_s)
    tries = _in_turns(
        run,
        peers,
        max(1, run.opts.repeat),
        what,
        lambda: ours.latency(run, *args),
        lambda peer: peer.latency(*args),
        lambda first, own: first[0] <= 2 * own[0],
    )
    for name, runs in tries.items():
        middle = (
            (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
            if runs
            else (None, None)
        )
        if name == OURS:
            p50.ours, p99.ours = middle
        else:
            p50.peers[name], p99.peers[name] = middle
        if len(runs) > 1:
            for row, i in ((p50, 0), (p99, 1)):
                each = ", ".join(f"{t[i]:.2f}" for t in runs)
                row.notes.append(f"{name}: median of {len(runs)} ({each})")
    return [p50, p99]

"""Rounds of faults against real daemons, the invariant checks after each, and the summary."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.faults import checks
from bench.faults.inject import INJECTORS
from bench.faults.plan import KINDS, RoundPlan, plan_round
from bench.faults.procs import alive, cgroup_names, cgroup_table
from bench.faults.world import Server, World
from harness.pgpair import PgPair
from harness.pgserver import PgServer

DRAIN_WITHIN = 120.0  # seconds for the acknowledged jobs to be done once the load stops
GONE_WITHIN = 15.0  # seconds for a round's processes and cgroups to go once it stopped


@dataclass
class RoundResult:
    plan: RoundPlan
    acked: int = 0
    forgiven: int = 0
    violations: dict[str, list[str]] = field(default_factory=dict)
    reruns: int = 0
    killed_runs: int = 0
    stale: int = 0
    worker_lost: int = 0
    damage: list[tuple[str, bool, bool]] = field(default_factory=list)
    lost_lease: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    recoveries: list[tuple[str, float]] = field(default_factory=list)
    switches: list[tuple[int, float, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(self.violations.values())

    def line(self) -> str:
        state = (
            "ok"
            if not self.failed
            else "FAILED "
            + "; ".join(
                f"{k}: {len(v)} ({', '.join(v[:3])})" for k, v in self.violations.items() if v
            )
        )
        return (
            f"{self.plan.describe()}: {self.acked} acked, {self.reruns} re-runs, "
            f"{self.forgiven} destroyed by journal damage, {self.seconds:.0f} s: {state}"
        )


def judge(
    world_acked: dict[str, str],
    forgiven: set[str],
    stored: dict[str, checks.Stored],
    runs: list[checks.Run],
    torn_lines: list[str],
    queue_log: list[dict[str, object]],
    refused: set[str],
) -> dict[str, list[str]]:
    """Every invariant on what a round left behind (processes aside)."""
    payload_counts = Counter(job.data for job in stored.values())
    return {
        "lost": checks.lost(world_acked, stored, forgiven),
        "stored though refused": checks.stored_though_refused(refused, stored),
        "duplicated": checks.duplicated(payload_counts),
        "corrupted": checks.corrupted(world_acked, stored),
        "not done ok": checks.not_done_ok(stored, [i for i in world_acked if i not in forgiven]),
        "overlapping runs": [
            f"{a.job_id} {a.owner}/{b.owner}" for a, b in checks.overlapping(runs)
        ],
        "outcome accepted twice": checks.accepted_twice(queue_log),
        "done without a run": checks.never_ran(stored, runs),
        "torn run-log lines": torn_lines,
    }


async def _leftovers(pids: list[int]) -> tuple[list[str], list[str]]:
    deadline = time.monotonic() + GONE_WITHIN
    while True:
        procs = checks.leftover_processes(cgroup_table(), pids, alive(pids))
        groups = checks.leftover_cgroups(cgroup_names(), pids)
        if (not procs and not groups) or time.monotonic() > deadline:
            return [str(p) for p in procs], groups
        await asyncio.sleep(0.1)


def _write_details(
    path: Path,
    result: RoundResult,
    stored: dict[str, checks.Stored],
    runs: list[checks.Run],
    records: list[dict[str, object]],
) -> None:
    """The runs, the stored row and the queue-log records of every job an invariant
    names, for a failed round."""
    by_id: dict[str, list[checks.Run]] = defaultdict(list)
    for run in runs:
        by_id[run.job_id].append(run)
    out = [result.line(), ""]
    for kind, found in result.violations.items():
        for item in found[:50]:
            job_id = item.split(" ", 1)[0]
            out.append(f"{kind}: {item}")
            out.append(f"  stored: {stored.get(job_id)}")
            out += [f"  run: {run}" for run in sorted(by_id.get(job_id, []), key=lambda r: r.start)]
            out += [f"  queue log: {r}" for r in records if r.get("id") == job_id]
    path.write_text("\n".join(out) + "\n")


async def run_round(
    plan: RoundPlan,
    seed: int,
    shared: PgServer,
    log_dir: Path,
    keep_logs: bool,
    synchronous: bool = True,
) -> RoundResult:
    """One round on the shared server, or on a primary and a standby of its own
    (synchronous unless told otherwise) when it has a failover."""
    if not plan.failover:
        return await _run_round(plan, seed, shared, log_dir, keep_logs)
    pair = PgPair(synchronous=synchronous)
    try:
        await asyncio.to_thread(pair.start)
        return await _run_round(plan, seed, pair, log_dir, keep_logs)
    finally:
        await asyncio.to_thread(pair.close)


async def _run_round(
    plan: RoundPlan, seed: int, pg: Server, log_dir: Path, keep_logs: bool
) -> RoundResult:
    result = RoundResult(plan)
    started = time.monotonic()
    admin_dsn = await asyncio.to_thread(pg.start)
    world = World(plan=plan, seed=seed, pg=pg, admin_dsn=admin_dsn, log_dir=log_dir)
    errors: list[str] = []
    try:
        await world.start()
        await world.probe(world.slots[0])  # everything runs before the first fault
        for fault in plan.faults:
            try:
                seconds = await INJECTORS[fault.kind](world, fault)
                result.recoveries.append((fault.kind, seconds))
            except Exception as exc:  # a fault that service did not survive
                errors.append(f"{fault}: {exc!r}")
                await asyncio.to_thread(pg.start)
                for slot in world.slots:
                    if slot.process is not None and not slot.process.running():
                        await world.restart(slot)
        await world.stop_load()
        await world.drain(DRAIN_WITHIN)
        stored = await world.read_store()
        runs, torn = checks.parse_run_log(world.run_log.read_text())
        if keep_logs:
            shutil.copyfile(world.run_log, log_dir / f"round-{plan.number}-runs.log")
        records = world.queue_log_records()
        result.violations = judge(
            world.acked, world.forgiven, stored, runs, torn, records, world.refused_payloads
        )
        result.stale = len(checks.stale_runs(stored, runs))
        result.reruns = checks.reruns(runs)
        if result.failed:
            path = log_dir / f"round-{plan.number}-details.txt"
            _write_details(path, result, stored, runs, records)
        result.killed_runs = sum(1 for r in runs if r.end is None)
    except Exception:
        errors.append(traceback.format_exc(limit=6))
    finally:
        try:
            await world.close()
            result.worker_lost = sum(w.lost for w in world.workers)
            result.lost_lease = sum(1 for r in world.queue_log_records() if r["ev"] == "lost-lease")
            procs, groups = await _leftovers(world.daemon_pids)
            result.violations["processes left"] = procs
            result.violations["cgroups left"] = groups
            bad_exits = [f"{name} exit {code}" for name, code in world.exit_codes if code != 0]
            result.violations["daemon stopped badly"] = bad_exits
        finally:
            await world.remove()
    result.violations["round problems"] = errors + world.problems
    result.acked = len(world.acked)
    result.forgiven = len(world.forgiven)
    result.damage = list(world.damage)
    result.refused = dict(world.refused)
    result.switches = list(world.switches)
    result.seconds = time.monotonic() - started
    return result


def _pct(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {statistics.median(values):.2f} s / max {max(values):.2f} s"


def summary(seed: int, results: list[RoundResult], seconds: float) -> str:
    faults = Counter(f.kind for r in results for f in r.plan.faults)
    totals: Counter[str] = Counter()
    for r in results:
        for kind, found in r.violations.items():
            totals[kind] += len(found)
    recovery: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for kind, s in r.recoveries:
            recovery[kind].append(s)
    damage = [d for r in results for d in r.damage]
    refused: Counter[int] = Counter()
    for r in results:
        refused.update(r.refused)
    lines = [
        f"fault campaign, seed {seed}: {len(results)} rounds in {seconds:.0f} s",
        "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())),
        f"jobs acknowledged: {sum(r.acked for r in results)}"
        f" (destroyed on purpose by journal damage: {sum(r.forgiven for r in results)})",
        f"adds refused: {dict(sorted(refused.items())) or 'none'}",
        f"journal damage reported at start-up: {sum(1 for d in damage if d[2])} of {len(damage)}"
        f" ({sum(1 for d in damage if d[1])} had to be)",
        f"lost: {totals['lost']}",
        f"stored though their add was refused: {totals['stored though refused']}",
        f"duplicated ingestions: {totals['duplicated']}",
        f"corrupted payloads: {totals['corrupted']}",
        f"not done ok: {totals['not done ok']}",
        f"overlapping runs: {totals['overlapping runs']}",
        f"outcomes accepted twice: {totals['outcome accepted twice']}",
        f"re-runs after crashes: {sum(r.reruns for r in results)}"
        f" (runs cut by a kill: {sum(r.killed_runs for r in results)};"
        f" late releases refused: {sum(r.lost_lease for r in results)};"
        f" runs started after another owner's accepted run: {sum(r.stale for r in results)};"
        f" pulled results dropped by workers: {sum(r.worker_lost for r in results)})",
        f"processes left: {totals['processes left']}, cgroups left: {totals['cgroups left']}",
        "recovery (healed -> add answered and a new job done):",
    ]
    lines += [f"  {kind}: {_pct(v)}" for kind, v in sorted(recovery.items())]
    switches = [s for r in results for s in r.switches]
    if switches:
        lines.append(
            "failover (kill -> first job done on the new primary): "
            + _pct([first for _, _, first in switches])
            + f"; promoted {_pct([hold for _, hold, _ in switches])} after the kill"
            + f"; WAL the standby lacked at the kill: max {max(b for b, _, _ in switches)} bytes"
        )
    failed = [r for r in results if r.failed]
    if failed:
        lines.append(f"FAILED rounds ({len(failed)}):")
        for r in failed:
            lines.append("  " + r.line())
            lines.append(
                f"  reproduce: python -m bench.faults --seed {seed} --only-round {r.plan.number}"
            )
    else:
        lines.append("every invariant held")
    return "\n".join(lines)


async def campaign(
    seed: int,
    rounds: list[int],
    keep_logs: Path | None = None,
    kinds: tuple[str, ...] = (),
    daemons: int | None = None,
    synchronous: bool = True,
) -> int:
    """Run ``rounds`` of ``seed``; print each round and the summary; 0 if all held."""
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="qd-faults-"))
    log_dir = keep_logs or root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    pg = PgServer(root)
    await asyncio.to_thread(pg.start)
    results: list[RoundResult] = []
    try:
        for number in rounds:
            plan = plan_round(seed, number, kinds, daemons)
            result = await run_round(plan, seed, pg, log_dir, keep_logs is not None, synchronous)
            results.append(result)
            print(result.line(), flush=True)
    finally:
        await asyncio.to_thread(pg.stop)
        pg_pid = pg.pid()
        shutil.rmtree(root, ignore_errors=True)  # the server's data; kept logs live elsewhere
    text = summary(seed, results, time.monotonic() - started)
    if pg_pid is not None and alive([pg_pid]):
        text += f"\nPostgreSQL left running (pid {pg_pid})"
        print(text, flush=True)
        return 1
    print(text, flush=True)
    if any(r.failed for r in results):
        print(
            f"daemon logs: {log_dir}" if keep_logs else "(--keep-logs DIR keeps the daemons' logs)"
        )
        return 1
    return 0


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if len(set(kinds)) < len(kinds):
        raise argparse.ArgumentTypeError(f"each fault kind at most once: {text!r}")
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind {', '.join(unknown) or text!r}; one of {', '.join(KINDS)}"
        )
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults",
        description="Random faults against real daemons; invariants checked after each round.",
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds to run (1..N)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault plan")
    parser.add_argument("--only-round", type=int, help="run only round K of this seed")
    parser.add_argument("--keep-logs", type=Path, help="keep the daemons' stderr logs in DIR")
    parser.add_argument("--plan", action="store_true", help="print the rounds' faults and exit")
    parser.add_argument(
        "--faults", type=_kinds, default=(), help="KIND[,KIND...]: these faults in every round"
    )
    parser.add_argument("--daemons", type=int, help="daemons in every round (default 2 or 3)")
    parser.add_argument(
        "--async-standby",
        action="store_true",
        help="a failover round's standby replicates asynchronously (what that loses is counted)",
    )
    args = parser.parse_args(argv)
    # the workers' own warnings (a refused complete after a stall) are counted instead
    logging.getLogger("queue_daemon.client").setLevel(logging.ERROR)
    if args.rounds < 1 or (args.only_round is not None and args.only_round < 1):
        parser.error("--rounds and --only-round must be at least 1")
    if args.daemons is not None and not 1 <= args.daemons <= 8:
        parser.error("--daemons must be 1 to 8")
    rounds = [args.only_round] if args.only_round else list(range(1, args.rounds + 1))
    if args.plan:
        for number in rounds:
            print(plan_round(args.seed, number, args.faults, args.daemons).describe())
        return 0
    return asyncio.run(
        campaign(
            args.seed,
            rounds,
            args.keep_logs,
            args.faults,
            args.daemons,
            synchronous=not args.async_standby,
        )
    )


if __name__ == "__main__":
    sys.exit(main())

"""Each fault: inject it into a running world, hold it, heal it, and time the recovery.

An injector returns the seconds from the moment the fault was healed until the
service answered an add and a new job was done OK again (``World.probe``).
What it sees going wrong on the way (a full journal that accepted every add,
say) goes into ``world.problems``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from bench.faults import checks, plan
from bench.faults.plan import Fault
from bench.faults.procs import children
from bench.faults.world import LEASE, World
from harness.pgpair import PgPair
from queue_daemon.journal.format import Frame, scan

Injector = Callable[[World, Fault], Awaitable[float]]
WAIT = 20.0  # seconds to wait for the moment a fault needs (a run in flight, …)


async def _poll(probe: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not probe():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _pid(world: World, fault: Fault) -> int:
    process = world.slots[fault.victim].process
    assert process is not None
    return process.pid


def _owner(pid: int) -> str:
    """The run log's owner of daemon ``pid``'s runs: its part of the work root,
    whose lock file it holds open (``runners.sandbox.workdirs``); "" before it has one."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.endswith(".lock") and os.path.basename(target).startswith("d-"):
                return target.removesuffix(".lock")
    return ""


async def _kill_daemon(world: World, fault: Fault) -> float:
    slot = world.slots[fault.victim]
    assert slot.process is not None
    slot.up = False
    await asyncio.to_thread(slot.process.kill)
    await asyncio.sleep(fault.hold)  # the fault lasting, not a synchronisation
    healed = time.monotonic()  # the restart is the healing: its start-up counts
    await world.restart(slot)
    return time.monotonic() - healed + await world.probe(slot)


async def kill_daemon_adds(world: World, fault: Fault) -> float:
    """kill -9 while adds reach it: the moment an add it answered comes back."""
    before = len(world.acked)
    slot = world.slots[fault.victim]
    rng = random.Random(fault.where)
    line = world.next_payloads(rng, "fb", 1)
    await world.add(slot, "fb", line)
    await _poll(lambda: len(world.acked) > before + 20, WAIT)
    return await _kill_daemon(world, fault)


async def kill_daemon_runs(world: World, fault: Fault) -> float:
    """kill -9 while one of its handlers runs a job."""
    pid = _pid(world, fault)
    slot = world.slots[fault.victim]
    rng = random.Random(fault.where)
    # slow jobs, so that one is surely in flight
    await world.add(slot, "fa", world.next_payloads(rng, "fa", 2, sleep=0.3))
    await world.add(slot, "fa", world.next_payloads(rng, "fa", 8))

    def running() -> bool:
        owner = _owner(pid)  # known once its sandbox is prepared
        opened: set[str] = set()
        for line in world.run_log.read_text().splitlines():
            parts = line.split(" ")
            if owner and len(parts) >= 4 and parts[2] == owner:
                key = f"{parts[1]} {parts[3]}"
                if parts[0] == "start":
                    opened.add(key)
                else:
                    opened.discard(key)
        return bool(opened)

    if not await _poll(running, WAIT):
        world.problems.append(f"{fault}: daemon{fault.victim} ran no job within {WAIT:.0f} s")
    return await _kill_daemon(world, fault)


async def kill_context(world: World, fault: Fault) -> float:
    """kill -9 of one of the daemon's handler processes (a child of the daemon)."""
    pid = _pid(world, fault)
    slot = world.slots[fault.victim]
    rng = random.Random(fault.where)
    await world.add(slot, "fa", world.next_payloads(rng, "fa", 8))
    seen: list[int] = []  # one look: a context may end between two

    def some() -> bool:
        seen[:] = children(pid)
        return bool(seen)

    if not await _poll(some, WAIT):
        world.problems.append(f"{fault}: daemon{fault.victim} started no handler context")
        return await world.probe(slot)
    victim = rng.choice(seen)
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGKILL)
    return await world.probe(slot)


async def stop_daemon(world: World, fault: Fault) -> float:
    """SIGSTOP past the lease, then SIGCONT: the other daemons take its jobs over."""
    slot = world.slots[fault.victim]
    assert slot.process is not None
    slot.up = False
    os.kill(slot.process.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(LEASE + 1.0 + fault.hold)
    finally:
        os.kill(slot.process.pid, signal.SIGCONT)
    slot.up = True
    return await world.probe(slot)


async def _pg_down(world: World, fault: Fault, how: Callable[[], None]) -> float:
    await asyncio.to_thread(how)
    await asyncio.sleep(fault.hold)
    await asyncio.to_thread(world.pg.start)
    return await world.probe(world.slots[fault.victim])


async def pg_stop_fast(world: World, fault: Fault) -> float:
    return await _pg_down(world, fault, world.pg.stop)


async def pg_stop_immediate(world: World, fault: Fault) -> float:
    return await _pg_down(world, fault, world.pg.crash)


async def pg_terminate(world: World, fault: Fault) -> float:
    """Cut every connection to the round's database (``pg_terminate_backend``)."""
    conn = await asyncpg.connect(world.admin_dsn)
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            world.database,
        )
    finally:
        await conn.close()
    return await world.probe(world.slots[fault.victim])


def _fill(disk: Path) -> Path:
    """Write a ballast file until the file system has no byte left."""
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        with contextlib.suppress(OSError):
            while True:  # the last partial block
                out.write(b"\0")
    return ballast


async def journal_full(world: World, fault: Fault) -> float:
    """The file system of its journal full: adds answer 503 until space returns."""
    slot = world.slots[fault.victim]
    if world.small_disk is None:
        return await world.probe(slot)  # the tmpfs could not be mounted (a problem says so)
    ballast = await asyncio.to_thread(_fill, world.small_disk)
    deadline = time.monotonic() + WAIT
    status, n = 200, 0
    while status != 503 and time.monotonic() < deadline:
        n += 1  # lines of 4 KB: what still fits in the last pages is acknowledged
        status = await world.add(slot, "fa", [checks.payload(0.0, f"fill.{n}." + "x" * 4000)])
    if status != 503:
        world.problems.append(f"{fault}: adds to a full journal were not refused with 503")
    await asyncio.sleep(fault.hold)
    ballast.unlink()
    return await world.probe(slot)


def _frames_after(journal: Path, sizes: dict[Path, int]) -> list[tuple[Path, Frame, bytes]]:
    """Complete batches of the journal's last segment written after ``sizes`` was taken."""
    segments = sorted(journal.glob("seg-*.log"))
    if not segments:
        return []
    last = segments[-1]
    data = last.read_bytes()
    since = sizes.get(last, 0)
    return [(last, f, data) for f in scan(data) if isinstance(f, Frame) and f.offset >= since]


def _ids(frame: Frame, data: bytes) -> list[str]:
    body = data[frame.body_offset : frame.body_offset + frame.body_len].decode(errors="replace")
    return [line.split("|", 1)[0] for line in body.splitlines()]


async def _journal_damage(world: World, fault: Fault, flip: bool) -> float:
    """With the store down (so its newest batches stay unread), the daemon acks a few
    adds and is killed; a byte of its journal's tail is then cut or flipped, the
    store started and the daemon restarted. What the damage destroyed is forgiven
    (a power loss leaves only unacknowledged bytes torn); the rest must be stored,
    with no torn or corrupted batch ingested."""
    slot = world.slots[fault.victim]
    assert slot.process is not None
    journals = sorted(slot.data_dir.glob("journal-*")) if slot.journal is None else [slot.journal]
    await asyncio.to_thread(world.pg.stop)
    sizes = {seg: seg.stat().st_size for j in journals for seg in j.glob("seg-*.log")}
    rng = random.Random(fault.where)
    for _ in range(5):
        await world.add(slot, "fa", world.next_payloads(rng, "fa", rng.randint(1, 6)))
    slot.up = False
    await asyncio.to_thread(slot.process.kill)
    if slot.journal is None:
        journals = sorted(slot.data_dir.glob("journal-*"))
    frames = [f for j in journals for f in _frames_after(j, sizes)]
    must_report = False
    if not frames:
        world.problems.append(f"{fault}: no batch written while the store was down")
    else:
        segment, frame, data = frames[int(fault.where * len(frames))]
        byte = frame.offset + int(rng.random() * (frame.end - frame.offset))
        with segment.open("r+b") as f:
            if flip:
                f.seek(byte)
                f.write(bytes([data[byte] ^ rng.randint(1, 255)]))
            else:
                f.truncate(byte)
        damaged = (
            [frame]
            if flip
            else [g for s, g, _ in frames if s == segment and g.offset >= frame.offset]
        )
        for g in damaged:
            world.forgiven.update(_ids(g, data))
        # a cut between two batches leaves nothing torn; a flip in the header's seq
        # or date digits leaves a valid batch (its lines intact); anything else in
        # the batch must be found and reported at start-up
        body = range(frame.body_offset, frame.body_offset + frame.body_len)
        must_report = byte != frame.offset if not flip else byte in body
    await asyncio.to_thread(world.pg.start)
    healed = time.monotonic()
    await world.restart(slot)
    restarted = time.monotonic() - healed
    assert slot.process is not None
    reported = "journal: " in slot.process.stderr_text()
    world.damage.append((fault.kind, must_report, reported))
    if must_report and not reported:
        world.problems.append(f"{fault}: the damaged journal was not reported at start-up")
    return restarted + await world.probe(slot)


async def journal_truncate(world: World, fault: Fault) -> float:
    return await _journal_damage(world, fault, flip=False)


async def journal_flip(world: World, fault: Fault) -> float:
    return await _journal_damage(world, fault, flip=True)


FIRST_DONE = (
    "SELECT extract(epoch FROM min(done_dt))::float8 FROM all_jobs"
    " WHERE lock = '__done' AND done_dt > to_timestamp($1)"
)


async def failover(world: World, fault: Fault) -> float:
    """The standby is cut off (as by a broken link) for ``hold`` seconds while adds
    and runs go on, then the primary is killed (``kill -9`` of all its processes),
    the standby is promoted and the old primary stays down. Notes the WAL the
    standby lacked at the kill and the seconds from the kill to the first job done
    on the new primary.

    A synchronous standby cut off holds every commit back (the ingest's flushes
    wait), so it lacks nothing acknowledged; an asynchronous one lacks what the
    primary committed meanwhile, and the summary counts what that lost."""
    pair = world.pg
    assert isinstance(pair, PgPair), "a failover needs a primary and a standby"
    before = len(world.acked)
    await _poll(lambda: len(world.acked) > before + 20, WAIT)
    await asyncio.to_thread(pair.cut_standby)
    await asyncio.sleep(fault.hold)  # the standby falling behind, not a synchronisation
    behind = await asyncio.to_thread(pair.behind)
    killed = time.time()
    await asyncio.to_thread(pair.kill_primary)
    healed = time.monotonic()
    await asyncio.to_thread(pair.promote)
    promoted = time.time() - killed
    seconds = time.monotonic() - healed + await world.probe(world.slots[fault.victim])
    conn = await asyncpg.connect(world.dsn)
    try:
        first = await conn.fetchval(FIRST_DONE, killed)
    finally:
        await conn.close()
    world.switches.append((behind, promoted, (first or time.time()) - killed))
    return seconds


INJECTORS: dict[str, Injector] = {
    plan.KILL_DAEMON_ADDS: kill_daemon_adds,
    plan.KILL_DAEMON_RUNS: kill_daemon_runs,
    plan.KILL_CONTEXT: kill_context,
    plan.STOP_DAEMON: stop_daemon,
    plan.PG_STOP_FAST: pg_stop_fast,
    plan.PG_STOP_IMMEDIATE: pg_stop_immediate,
    plan.PG_TERMINATE: pg_terminate,
    plan.JOURNAL_FULL: journal_full,
    plan.JOURNAL_TRUNCATE: journal_truncate,
    plan.JOURNAL_FLIP: journal_flip,
    plan.FAILOVER: failover,
}

"""One round's world: a fresh database, two or three daemons, tenants and their load.

The daemons are started as an operator starts them (``harness/daemons.py``),
each with a data directory and a fixed port of its own, so a daemon restarted
after a kill comes back at the same address and adopts its journal. Three
tenants add jobs over HTTP all the time: two of daemon-run python handlers,
one of a pulled type run by two ``queue_daemon.client.Worker``s (one per
daemon address). Every run, wherever it runs, appends a start and an end
record to one run log in a directory the sandboxed handlers can write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import asyncpg

from bench.faults import checks
from bench.faults.plan import RoundPlan
from harness.api import Api, Handlers
from harness.daemons import (
    DaemonFactory,
    DaemonProcess,
    add_tenant,
    reachable_dir,
)
from harness.databases import with_database
from queue_daemon.client import Job, Worker

LEASE = 3.0
DAEMON_ARGS = ("--lease", "3", "--max-batch", "10", "--concurrency", "16", "--drain-timeout", "2")
TENANTS = {"fa": "work", "fb": "work", "fc": "pull"}  # tenant -> its jobtype
PULLED = "fc"
SLEEPS = (0.0, 0.0, 0.005, 0.02, 0.1)  # what a job's handler sleeps, seconds
MAX_ATTEMPTS = 50  # a job of a round survives every fault it meets
ADD_TIMEOUT = 5.0
SMALL_DISK = "16m"
STILL = 15.0  # seconds without change after which the jobs missing from the store are lost


def handler_source(log: Path) -> str:
    """A python handler that records its run and returns ``ok <payload> <owner>``, the
    owner being its daemon's part of the work root (``<work root>/d-<id>``, one per
    daemon process: its pid inside a PID namespace of its own says nothing)."""
    return (
        "import os, time\n"
        f"LOG = {str(log)!r}\n"
        "\n"
        "def _note(line):\n"
        "    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND)\n"
        "    try:\n"
        "        os.write(fd, line.encode())\n"
        "    finally:\n"
        "        os.close(fd)\n"
        "\n"
        "def handler(payload, ctx):\n"
        "    owner = os.path.dirname(os.getcwd())\n"
        "    start = repr(time.time())\n"
        "    _note(f'start {ctx.id} {owner} {start}\\n')\n"
        "    time.sleep(float(payload.split('/')[0]))\n"
        "    _note(f'end {ctx.id} {owner} {start} {time.time()!r}\\n')\n"
        "    return f'ok {payload} {owner}'\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Slot:
    """One daemon's place: data directory, port, and its current process."""

    number: int
    data_dir: Path
    port: int
    journal: Path | None
    process: DaemonProcess | None = None
    up: bool = False
    incarnation: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Server(Protocol):
    """The round's PostgreSQL: ``harness.pgserver.PgServer``, or a primary and a
    standby (``harness.pgpair.PgPair``) for a round with a failover."""

    def start(self) -> str: ...

    def stop(self) -> None: ...

    def crash(self) -> None: ...


@dataclass
class World:
    plan: RoundPlan
    seed: int
    pg: Server
    admin_dsn: str
    log_dir: Path
    root: Path = field(init=False)
    dsn: str = field(init=False)
    database: str = field(init=False)
    run_log: Path = field(init=False)
    small_disk: Path | None = None
    slots: list[Slot] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    acked: dict[str, str] = field(default_factory=dict)
    forgiven: set[str] = field(default_factory=set)
    damage: list[tuple[str, bool, bool]] = field(default_factory=list)  # kind, must, reported
    refused: dict[int, int] = field(default_factory=dict)  # status -> adds answered so
    refused_payloads: set[str] = field(default_factory=set)  # of adds refused whole
    problems: list[str] = field(default_factory=list)  # invariant failures seen by injectors
    daemon_pids: list[int] = field(default_factory=list)
    exit_codes: list[tuple[str, int | None]] = field(default_factory=list)
    # of each failover: WAL bytes the standby lacked just before the kill, seconds
    # until the promotion, seconds from the kill to the first job done after it
    switches: list[tuple[int, float, float]] = field(default_factory=list)
    _factory: DaemonFactory = field(init=False)
    _session: aiohttp.ClientSession = field(init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _adders: list[asyncio.Task[None]] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tag: int = 0

    # --- start ----------------------------------------------------------------

    async def start(self) -> None:
        self.root = reachable_dir(f"qd-faults-r{self.plan.number}-")
        self._factory = DaemonFactory(self.log_dir)
        self.run_log = self._factory.shared_dir() / "runs.log"
        self.run_log.touch()
        self.run_log.chmod(0o666)  # handlers run as another user
        self.database = f"qd_faults_{os.getpid()}_r{self.plan.number}"
        await self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        await self._admin(f'CREATE DATABASE "{self.database}"')
        self.dsn = with_database(self.admin_dsn, self.database)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ADD_TIMEOUT))
        full = self.plan.full_disk_victim
        if full is not None:
            self.small_disk = await asyncio.to_thread(self._mount_small_disk)
        for n in range(self.plan.daemons):
            journal = self.small_disk / "journal" if full == n and self.small_disk else None
            self.slots.append(Slot(n, self.root / f"data{n}", free_port(), journal))
        cli = self.root / "cli"
        for tenant in TENANTS:  # one after another: the first migrates the new database
            self.tokens[tenant] = await asyncio.to_thread(
                add_tenant, tenant, store=self.dsn, data_dir=cli, cwd=self.root
            )
        await asyncio.gather(*(self.restart(slot) for slot in self.slots))
        api = self.api(self.slots[0], "fa")
        source = handler_source(self.run_log)
        for tenant, jobtype in TENANTS.items():
            handlers = Handlers(api.as_(tenant, self.tokens[tenant]))
            if tenant == PULLED:
                reply = await handlers.add_raw(
                    jobtype, {"lang": "worker", "timeout": 4, "maxAttempts": MAX_ATTEMPTS}
                )
                assert reply.status == 200, reply
            else:
                await handlers.add(jobtype, "python", source, timeout=10, maxAttempts=MAX_ATTEMPTS)
        rng = random.Random(f"queue-daemon-faults/{self.seed}/{self.plan.number}/load")
        for tenant in TENANTS:
            self._adders.append(
                asyncio.create_task(self._adder(tenant, random.Random(rng.random())))
            )
        self._tasks += self._adders
        for slot in self.slots[:2]:
            worker = Worker(
                slot.url,
                TENANTS[PULLED],
                self._pulled(f"w{slot.number}"),
                client=PULLED,
                token=self.tokens[PULLED],
                name=f"w{slot.number}",
                concurrency=4,
                batch=10,
                wait=2,
                grace=2,
            )
            self.workers.append(worker)
            self._tasks.append(asyncio.create_task(worker.run(handle_signals=False)))

    def _mount_small_disk(self) -> Path | None:
        mount = self.root / "small"
        mount.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK},mode=0700", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            self.problems.append(f"cannot mount a tmpfs for the journal: {done.stderr.strip()}")
            return None
        return mount

    async def _admin(self, sql: str) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    def api(self, slot: Slot, tenant: str) -> Api:
        return Api(self._session, slot.url, tenant, self.tokens.get(tenant))

    async def restart(self, slot: Slot) -> None:
        """Start the slot's daemon (again) and wait until it listens."""
        slot.incarnation += 1
        args = [*DAEMON_ARGS, "--port", str(slot.port)]
        if slot.journal is not None:
            args += ["--journal", str(slot.journal)]
        name = f"r{self.plan.number}-daemon{slot.number}.{slot.incarnation}"
        process = self._factory.spawn(slot.data_dir, self.dsn, *args, name=name)
        self.daemon_pids.append(process.pid)
        slot.process = process
        await asyncio.to_thread(process.wait_ready)
        slot.up = True

    # --- load -----------------------------------------------------------------

    def next_payloads(
        self, rng: random.Random, tenant: str, count: int, sleep: float | None = None
    ) -> list[str]:
        out = []
        for _ in range(count):
            self._tag += 1
            how_long = rng.choice(SLEEPS) if sleep is None else sleep
            out.append(checks.payload(how_long, f"{tenant}.{self._tag}"))
        return out

    async def add(self, slot: Slot, tenant: str, lines: list[str]) -> int:
        """One add to ``slot``; the ids of a 2xx answer are recorded as acknowledged.
        Returns the status (0: no answer)."""
        try:
            reply = await self.api(slot, tenant).add_raw(TENANTS[tenant], "\n".join(lines) + "\n")
        except (aiohttp.ClientError, TimeoutError):
            return 0
        if 200 <= reply.status < 300:
            self.acked.update(zip(reply.json["ids"], lines, strict=True))
        else:
            self.refused[reply.status] = self.refused.get(reply.status, 0) + 1
            if checks.refused_whole(reply.status):
                self.refused_payloads.update(lines)
        return reply.status

    async def _adder(self, tenant: str, rng: random.Random) -> None:
        while not self._stop.is_set():
            up = [s for s in self.slots if s.up]
            if up:
                await self.add(
                    rng.choice(up), tenant, self.next_payloads(rng, tenant, rng.randint(1, 8))
                )
            # a steady rate, not a flood: the faults are the subject here
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), rng.uniform(0.02, 0.06))

    def _pulled(self, name: str) -> Callable[[Job], Awaitable[str]]:
        """The function a pulled worker named ``name`` runs: records its run as a handler does."""
        owner = f"w-{name}"

        async def run(job: Job) -> str:
            start = repr(time.time())
            self._note(f"start {job.id} {owner} {start}\n")
            await asyncio.sleep(float(job.payload.split("/")[0]))
            self._note(f"end {job.id} {owner} {start} {time.time()!r}\n")
            return f"ok {job.payload} {owner}"

        return run

    def _note(self, line: str) -> None:
        fd = os.open(self.run_log, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    # --- probes -----------------------------------------------------------------

    async def probe(self, slot: Slot, within: float = 90.0) -> float:
        """Seconds until an add to ``slot`` is answered 200 and its job is done OK."""
        started = time.monotonic()
        deadline = started + within
        rng = random.Random()
        while True:
            lines = [checks.payload(0.0, f"probe.{started}.{rng.random()}")]
            if await self.add(slot, "fa", lines) == 200:
                break
            if time.monotonic() > deadline:
                raise ProbeTimeout(f"daemon{slot.number} answered no add within {within:.0f} s")
            await asyncio.sleep(0.05)
        job_id = next(i for i, p in self.acked.items() if p == lines[0])
        while True:
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn = await asyncpg.connect(self.dsn, timeout=5)
                try:
                    done = await conn.fetchval(
                        "SELECT lock = '__done' AND code = 'ok' FROM all_jobs WHERE id = $1", job_id
                    )
                finally:
                    await conn.close()
                if done:
                    return time.monotonic() - started
            if time.monotonic() > deadline:
                raise ProbeTimeout(f"probe job {job_id} not done OK within {within:.0f} s")
            await asyncio.sleep(0.05)

    # --- end ------------------------------------------------------------------

    async def stop_load(self) -> None:
        """Stop adding, and wait for the adds under way: an add answered after
        ``drain`` read what was acknowledged would be judged without its wait."""
        self._stop.set()
        _, pending = await asyncio.wait(self._adders, timeout=ADD_TIMEOUT * 2)
        if pending:
            self.problems.append(f"{len(pending)} adders still adding after the load stopped")

    async def drain(self, within: float) -> None:
        """Wait until every acknowledged job (a journal fault's victims aside) is done,
        or every one in the store is and nothing changed for ``STILL`` seconds (the
        rest are lost: an asynchronous standby's failover)."""
        wanted = [i for i in self.acked if i not in self.forgiven]
        deadline = time.monotonic() + within
        seen, since = (-1, -1), time.monotonic()
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn = await asyncpg.connect(self.dsn, timeout=5)
                try:
                    row = await conn.fetchrow(
                        "SELECT count(*) AS present, count(*) FILTER (WHERE lock = '__done')"
                        " AS done FROM all_jobs WHERE id = ANY($1::text[])",
                        wanted,
                    )
                finally:
                    await conn.close()
                assert row is not None
                if row["done"] == len(wanted):
                    return
                if (row["present"], row["done"]) != seen:
                    seen, since = (row["present"], row["done"]), time.monotonic()
                elif row["done"] == row["present"] and time.monotonic() - since > STILL:
                    return
            await asyncio.sleep(0.2)

    async def read_store(self) -> dict[str, checks.Stored]:
        """Every job in the store, live or done. An id stored twice (in jobs and in
        jobs_done) is kept under a second key, so its payload counts as duplicated."""
        conn = await asyncpg.connect(self.dsn)
        try:
            rows = await conn.fetch(
                "SELECT id, data, lock = '__done' AS done, code, exitcode, result FROM all_jobs"
            )
        finally:
            await conn.close()
        stored: dict[str, checks.Stored] = {}
        for r in rows:
            key = r["id"] if r["id"] not in stored else f"{r['id']} (again)"
            stored[key] = checks.Stored(
                id=r["id"],
                data=r["data"],
                done=r["done"],
                code=r["code"],
                exitcode=r["exitcode"],
                result=r["result"],
            )
        return stored

    def queue_log_records(self) -> list[dict[str, object]]:
        """Every record of the daemons' queue logs (a line torn by a kill is skipped)."""
        records = []
        for slot in self.slots:
            for path in slot.data_dir.glob("queue-*.log"):
                for line in path.read_text(errors="replace").splitlines():
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if isinstance(record, dict):
                            records.append(record)
        return records

    async def close(self) -> None:
        """Stop the load, the workers and the daemons (SIGTERM, drained)."""
        self._stop.set()
        for slot in self.slots:
            if slot.process is not None and slot.process.running():
                os.kill(slot.process.pid, signal.SIGCONT)  # a stopped daemon cannot drain
        for worker in self.workers:
            worker.stop()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=30)
            for task in pending:
                task.cancel()
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    self.problems.append(f"a load task failed: {task.exception()!r}")
        for slot in self.slots:
            process = slot.process
            if process is not None and process.running():
                code = await asyncio.to_thread(process.terminate)
                self.exit_codes.append((process.name, code))
        await asyncio.to_thread(self._factory.close)
        await self._session.close()

    async def remove(self) -> None:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            await self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        if self.small_disk is not None:
            await asyncio.to_thread(
                subprocess.run, ["umount", "-l", str(self.small_disk)], check=False
            )
        shutil.rmtree(self.root, ignore_errors=True)


class ProbeTimeout(Exception):
    """Service did not come back after a fault was healed."""

"""A hostile tenant against a calm one, for the ``abuse`` section.

One daemon (as root: per-tenant uids, namespaces and cgroups), two tenants.
The calm tenant posts one ``PY_CLOCK`` job at a time, as in the ``latency``
section, first on the idle daemon, then during each attack of a hostile
tenant (or of an anonymous client), one attack at a time:

- ``same bytes``: not an attack but the yardstick of the next: a third
  tenant with the hostile one's limits adds jobs of 1 MiB over HTTP at the
  rate at which the follow-on jobs of ``emit`` get through (before it, so
  that what ``emit`` leaves in the daemon's memory is not counted here);
- ``emit``: runs that ask for 60 follow-on jobs of 1 MiB each;
- ``connections``: thousands of connections that send half a request's headers
  and then nothing;
- ``bodies``: 24 requests whose 64 MiB bodies trickle in at 16 KiB a second;
- ``follow-ons``: runs that each print 10,000 ``J:`` lines of their own type
  (the hostile tenant has a waiting limit of 1,000 and a rate of 100 jobs/s);
- ``stderr``: eight shell jobs at a time of ``yes "" >&2``;
- ``stats``: eight parallel loops of ``GET /stats``.

For each phase it prints the calm tenant's add → start p50 and p99, the
daemon's resident memory and open descriptors (the most seen, sampled every
0.1 s), and the calm requests that failed; each against idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from bench.api import Api
from bench.e2e import PY_CLOCK, Latency
from bench.procs import BenchError
from bench.report import Row
from queue_daemon.store.embedded import stop_server

if TYPE_CHECKING:
    from bench.cli import Run

CALM_TYPE = "clock"
Attack = Callable[[], contextlib.AbstractAsyncContextManager[str]]
HOSTILE = "mallory"
HOSTILE_LIMITS = ("waiting=1000", "rate=100", "burst=200")
BYTES_TENANT = "bytes"  # the yardstick of ``emit``: adds of big jobs at the same rate


@dataclass(slots=True)
class Phase:
    name: str
    starts_ms: list[float] = field(default_factory=list)
    failed: int = 0
    rss_mib: float = 0.0
    fds: int = 0
    note: str = ""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _watch(pid: int, phase: Phase, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            phase.rss_mib = max(phase.rss_mib, _rss_mib(pid))
            phase.fds = max(phase.fds, _fds(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def _calm(api: Api, phase: Phase, samples: int, pause: float) -> None:
    """``samples`` calm jobs one at a time; a failed add or run is counted, not raised."""
    for _ in range(samples):
        sent = time.time()
        try:
            (job_id,) = await asyncio.wait_for(api.post(CALM_TYPE, b'{"calm": 1}\n'), 30)
            deadline = time.monotonic() + 30
            while True:
                job = await asyncio.wait_for(api.job(job_id), 30)
                if job is not None and job.get("state") == "done":
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"calm job {job_id} not done within 30 s")
                await asyncio.sleep(0.002)
            if job.get("code") != "ok":
                raise BenchError(f"calm job ended {job.get('code')}")
            phase.starts_ms.append(1000 * (float(job["result"]) - sent))
        except (BenchError, TimeoutError):
            phase.failed += 1
        await asyncio.sleep(pause)


# --- the attacks: each an async context manager, running while the calm tenant samples


@contextlib.asynccontextmanager
async def _posting(
    api: Api, type_: str, body: bytes, every: float, counts: list[int] | None = None
) -> AsyncIterator[None]:
    """Post ``body`` to ``type_`` every ``every`` seconds (on a fixed schedule)
    until the block ends; refusals, e.g. ``429``, are part of the attack.
    ``counts``, when given, gets [accepted, refused] posts."""
    stop = asyncio.Event()
    counted = [0, 0] if counts is None else counts
    counted[:] = [0, 0]  # a caller's list starts again at zero

    async def keep_posting() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        while not stop.is_set():
            try:
                await api.post(type_, body)
                counted[0] += 1
            except BenchError:
                counted[1] += 1
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, start + n * every - loop.time()))

    task = asyncio.create_task(keep_posting())
    try:
        yield
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def emit_attack(hostile: Api) -> AsyncIterator[str]:
    body = "def handler(p, ctx):\n    for _ in range(60):\n        ctx.emit('kid', 'x' * 1048560)\n"
    await hostile.add_handler("emit", "python", body)
    try:
        async with _posting(hostile, "emit", b"".join(b"%d\n" % n for n in range(25)), 1.0):
            yield "25 runs a second, each asking for 60 follow-on jobs of 1 MiB"
    finally:
        await hostile.del_handler("emit")


# What of emit_attack's follow-on jobs its rate lets through: 100 tokens a
# second, less its 25 adds a second; a run's follow-on jobs are admitted
# together, four of 1 MiB (its emit limit of 4 MiB) taking 4 + 63 tokens
# (rate_cost), 16.75 a job: about 4.5 jobs a second
SAME_BYTES_EVERY = (4 + 63) / 4 / (100 - 25)
SAME_BYTES_LINE = b'"' + b"x" * ((1 << 20) - 18) + b'"\n'  # 16 tokens, as the follow-on jobs


@contextlib.asynccontextmanager
async def same_bytes(tenant: Api, added: list[int]) -> AsyncIterator[str]:
    """The yardstick of ``emit_attack``: jobs of 1 MiB added over HTTP, on a
    fixed schedule, at the rate at which the hostile tenant's follow-on jobs
    get through, to a type with no handler: what those bytes cost a calm
    tenant by themselves. ``added`` gets [accepted, refused] posts."""
    async with _posting(tenant, "kid", SAME_BYTES_LINE, SAME_BYTES_EVERY, added):
        yield (
            "another tenant with the hostile one's limits adding 1 MiB jobs over HTTP"
            f" at {1 / SAME_BYTES_EVERY:.1f}/s, what the rate lets through of emit's"
        )


@contextlib.asynccontextmanager
async def connections_attack(url: str, count: int) -> AsyncIterator[str]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1024)), hard))
    host, port = url.removeprefix("http://").rsplit(":", 1)
    writers: list[asyncio.StreamWriter] = []
    refused = 0
    for _ in range(count):
        try:
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"POST /mallory/job/x/add HTTP/1.1\r\nHost: a\r\n")
            writers.append(writer)
        except OSError:
            refused += 1
    try:
        yield f"{len(writers):,} connections holding half a request's headers ({refused} refused)"
    finally:
        for writer in writers:
            writer.close()


@contextlib.asynccontextmanager
async def bodies_attack(url: str, token: str, count: int = 24) -> AsyncIterator[str]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stop = asyncio.Event()
    head = (
        f"POST /{HOSTILE}/job/slow/add HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {64 << 20}\r\n\r\n"
    ).encode()

    async def trickle() -> None:
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            try:
                writer.write(head)
                chunk = b"x" * 16383 + b"\n"
                while not stop.is_set() and not reader.at_eof():
                    writer.write(chunk)
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)
            finally:
                writer.close()

    tasks = [asyncio.create_task(trickle()) for _ in range(count)]
    try:
        yield f"{count} requests whose 64 MiB bodies come at 16 KiB/s"
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def follow_ons_attack(hostile: Api) -> AsyncIterator[str]:
    await hostile.add_handler("grow", "shell", 'seq 10000 | sed "s/^/J: grow|/"')
    for _ in range(3):
        with contextlib.suppress(BenchError):
            await hostile.post("grow", b"seed\n")
    try:
        yield "runs printing 10,000 J: lines of their own type (waiting 1,000, rate 100/s)"
    finally:
        await hostile.del_handler("grow")


@contextlib.asynccontextmanager
async def stderr_attack(hostile: Api) -> AsyncIterator[str]:
    await hostile.add_handler("noise", "shell", 'timeout 5 yes "" >&2')
    try:
        async with _posting(hostile, "noise", b"1\n2\n3\n4\n5\n6\n7\n8\n", 5.0):
            yield 'eight shell jobs at a time of `yes "" >&2`'
    finally:
        await hostile.del_handler("noise")


@contextlib.asynccontextmanager
async def stats_attack(hostile: Api, loops: int = 8) -> AsyncIterator[str]:
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            with contextlib.suppress(BenchError):
                await hostile.stats("x")

    tasks = [asyncio.create_task(poll()) for _ in range(loops)]
    try:
        yield f"{loops} parallel loops of GET /stats"
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def measure_abuse(
    url: str,
    pid: int,
    calm: tuple[str, str],
    hostile: tuple[str, str],
    bytes_tenant: tuple[str, str],
    *,
    samples: int,
    connections: int,
    settle: float,
) -> list[Phase]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        calm_api = Api(session, url, calm[1], calm[0])
        hostile_api = Api(session, url, hostile[1], hostile[0])
        bytes_api = Api(session, url, bytes_tenant[1], bytes_tenant[0])
        posted: list[int] = []  # the yardstick's posts: accepted, refused
        await calm_api.add_handler(CALM_TYPE, "python", PY_CLOCK)
        await _calm(calm_api, Phase("warm"), 5, 0.05)
        attacks: list[tuple[str, Attack | None]] = [
            ("idle", None),
            ("same bytes", lambda: same_bytes(bytes_api, posted)),
            ("emit (1)", lambda: emit_attack(hostile_api)),
            ("connections (6)", lambda: connections_attack(url, connections)),
            ("bodies (7)", lambda: bodies_attack(url, hostile[1])),
            ("follow-ons (8)", lambda: follow_ons_attack(hostile_api)),
            ("stderr (9)", lambda: stderr_attack(hostile_api)),
            ("stats (10)", lambda: stats_attack(hostile_api)),
        ]
        phases = []
        for name, attack in attacks:
            phase = Phase(name)
            stop = asyncio.Event()
            watcher = asyncio.create_task(_watch(pid, phase, stop))
            try:
                if attack is None:
                    await _calm(calm_api, phase, samples, 0.05)
                else:
                    async with attack() as note:
                        phase.note = note
                        await asyncio.sleep(settle)  # the attack under way
                        await _calm(calm_api, phase, samples, 0.05)
            finally:
                stop.set()
                await watcher
            if name == "same bytes":
                phase.note += f" ({posted[0]} added, {posted[1]} refused)"
            phases.append(phase)
            print(
                f"    {name}: calm add → start p50 {_pct(phase.starts_ms, 0.5):.1f} ms, p99 "
                f"{_pct(phase.starts_ms, 0.99):.1f} ms; daemon {phase.rss_mib:.0f} MiB, "
                f"{phase.fds} fds; {phase.failed} calm failures",
                flush=True,
            )
            await asyncio.sleep(settle)  # what the attack left behind settles
        return phases


def _pct(values: list[float], q: float) -> float:
    return Latency.pct(values, q) if values else float("nan")


def section_abuse(run: Run) -> None:
    """The calm tenant's figures idle and under each attack, on a daemon of its own."""
    from bench import daemon

    dsn = None if run.opts.store is None else run.fresh_database("abuse")
    data_dir = run.work / "abuse"
    data_dir.mkdir()
    quick = run.opts.quick
    try:
        calm_token = daemon.add_tenant(dsn, data_dir)
        hostile_token = daemon.add_tenant(dsn, data_dir, HOSTILE)
        daemon.tenant_limits(dsn, data_dir, HOSTILE, HOSTILE_LIMITS)
        bytes_token = daemon.add_tenant(dsn, data_dir, BYTES_TENANT)
        daemon.tenant_limits(dsn, data_dir, BYTES_TENANT, HOSTILE_LIMITS)
        child, url = daemon.start_daemon("abuse", dsn, data_dir, run.work, run.opts.daemon_args)
    except BaseException:
        stop_server(data_dir / "pg")
        raise
    try:
        phases = asyncio.run(
            measure_abuse(
                url,
                child.pid,
                (daemon.TENANT, calm_token),
                (HOSTILE, hostile_token),
                (BYTES_TENANT, bytes_token),
                samples=run.opts.abuse_samples,
                connections=2_000 if quick else 10_000,
                settle=1.0 if quick else 3.0,
            )
        )
    finally:
        child.stop(grace=20)
        stop_server(data_dir / "pg")
    idle, attacks = phases[0], phases[1:]
    base99, base_rss = _pct(idle.starts_ms, 0.99), idle.rss_mib
    run.rows.append(
        Row(
            "(abuse) idle: calm add → start p99",
            base99,
            "ms",
            notes=f"p50 {_pct(idle.starts_ms, 0.5):.1f} ms; daemon {base_rss:.0f} MiB, "
            f"{idle.fds} fds; {len(idle.starts_ms)} calm jobs one at a time",
        )
    )
    yardstick = {phase.name: phase for phase in attacks}.get("same bytes")
    for phase in attacks:
        p99 = _pct(phase.starts_ms, 0.99)
        target = "target: p99 <= 2x idle, none failed"
        if phase is yardstick:
            target = "the yardstick of emit, not an attack"
        elif phase.name.startswith("emit") and yardstick is not None:
            same = _pct(yardstick.starts_ms, 0.99)
            target += f"; {p99 / same:.2f}x the same bytes' p99" if same > 0 else ""
        run.rows.append(
            Row(
                f"(abuse) {phase.name}: calm add → start p99",
                p99,
                "ms",
                "idle",
                p99 / base99 if base99 > 0 else None,
                f"{phase.note}; p50 {_pct(phase.starts_ms, 0.5):.1f} ms; "
                f"{phase.failed} calm failures ({target})",
            )
        )
        memory = "target <= 2x idle" if phase is not yardstick else "the yardstick of emit"
        if phase.name.startswith("emit") and yardstick is not None and yardstick.rss_mib > 0:
            memory += f"; {phase.rss_mib / yardstick.rss_mib:.2f}x the same bytes'"
        run.rows.append(
            Row(
                f"(abuse) {phase.name}: daemon resident memory",
                phase.rss_mib,
                "MiB",
                "idle",
                phase.rss_mib / base_rss if base_rss > 0 else None,
                f"at most {phase.fds} open descriptors (idle {idle.fds}); {memory}",
            )
        )
        if phase.failed:
            run.failed = True

"""End to end through real daemons: jobs posted over HTTP, run by handlers in warm
contexts, archived. Used by the ``run1``, ``run3`` and ``latency`` sections.

Throughput (``measure_throughput``): a no-op handler is registered and warmed
with a few hundred jobs, then ``jobs`` jobs go out in 1000-line POSTs (several
in flight, round-robin over the daemons) as fast as the daemons acknowledge
them; the clock runs from the first POST until ``/stats`` shows ``done_ok``
grown by ``jobs`` (see ``measure_throughput`` for how it polls). Along the way
it notes when the last POST was acknowledged and when the last jobs were in the
store (ingested), and the CPU used by the daemons, their runner contexts,
PostgreSQL, the bench itself and the whole machine.

Latency (``measure_latency``): one job at a time on an idle daemon; the
handler returns ``time.time()`` when it starts, which is compared with the
bench's clock just before the POST (same machine, same clock).
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.api import Api
from bench.procs import BenchError, machine_busy, tree_cpu

PY_NOOP = "def handler(p, ctx):\n    return None\n"
NODE_NOOP = "module.exports = (payload, ctx) => {};\n"
PY_CLOCK = "import time\n\n\ndef handler(p, ctx):\n    return str(time.time())\n"
WASM_NOOP = '(module (memory (export "memory") 1) (func (export "_start")))'
NOOP = {"python": PY_NOOP, "node": NODE_NOOP, "wasm": WASM_NOOP}
POST_LINES = 1000
WARM_POST_LINES = 100  # warm-up posts are small, so that several contexts start


def bulk_body(lines: int) -> bytes:
    return b"".join(b'{"n": %d}\n' % i for i in range(lines))


@dataclass(slots=True)
class Cpu:
    """CPU seconds so far of everything the end-to-end run involves."""

    daemons: float
    contexts: float
    postgres: float
    bench: float
    machine: float
    at: float

    @classmethod
    def sample(cls, daemons: Sequence[int], postmaster: int | None) -> Cpu:
        own, below = tree_cpu(daemons)
        pg_own, pg_below = tree_cpu([postmaster]) if postmaster is not None else (0.0, 0.0)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(
            daemons=own,
            contexts=below,
            postgres=pg_own + pg_below,
            bench=usage.ru_utime + usage.ru_stime,
            machine=machine_busy()[0],
            at=time.monotonic(),
        )

    def cores_since(self, start: Cpu) -> dict[str, float]:
        """Cores (CPU seconds per second) each part used between ``start`` and this sample."""
        span = max(self.at - start.at, 1e-9)
        return {
            "daemon": (self.daemons - start.daemons) / span,
            "contexts": (self.contexts - start.contexts) / span,
            "postgres": (self.postgres - start.postgres) / span,
            "bench": (self.bench - start.bench) / span,
            "machine": (self.machine - start.machine) / span,
        }


@dataclass(slots=True)
class Throughput:
    lang: str
    daemons: int
    jobs: int
    seconds: float  # first POST → done_ok grew by ``jobs``
    posted: float  # first POST → last acknowledgement
    stored: float | None  # first POST → the last acknowledged jobs seen in the store
    cores: dict[str, float]
    stats_ms: float  # mean time of one /stats call
    polls: int
    timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def describe(self) -> str:
        stored = "?" if self.stored is None else f"{self.stored:.2f}"
        cores = ", ".join(f"{name} {value:.2f}" for name, value in self.cores.items())
        return (
            f"{self.jobs:,} jobs in {self.seconds:.2f} s: acked by {self.posted:.2f} s "
            f"({self.jobs / self.posted:,.0f}/s), last ones in the store by {stored} s, "
            f"done {self.seconds:.2f} s; cores used: {cores} (of {os.cpu_count()}); "
            f"/stats {self.stats_ms:.1f} ms x{self.polls}"
        )


def _total(counts: dict[str, int]) -> int:
    return sum(counts.values())


def _bad(counts: dict[str, int], base: dict[str, int]) -> int:
    return sum(counts[k] - base[k] for k in ("done_failed", "done_error"))


async def _wait_done(
    api: Api, type_: str, target: int, base: dict[str, int], within: float, poll: float
) -> dict[str, int]:
    deadline = time.monotonic() + within
    while True:
        counts = await api.stats(type_)
        if _bad(counts, base):
            raise BenchError(f"jobs of {type_} failed: {counts}")
        if counts["done_ok"] >= target:
            return counts
        if time.monotonic() > deadline:
            raise BenchError(f"{type_}: done_ok {counts['done_ok']}/{target} after {within:.0f} s")
        await asyncio.sleep(poll)


def _later(a: str, b: str) -> str:
    """The later of two ids of one daemon (they sort by time, then by length)."""
    return max(a, b, key=lambda i: (len(i), i))


async def _post_all(
    apis: Sequence[Api], type_: str, body: bytes, posts: int, conns: int
) -> tuple[float, list[str]]:
    """POST ``body`` ``posts`` times, ``conns`` at a time, round-robin over ``apis``;
    (the monotonic time of the last acknowledgement, the last id each daemon gave)."""
    lines = body.count(b"\n")
    next_post = 0
    last = 0.0
    latest = ["" for _ in apis]

    async def worker() -> None:
        nonlocal next_post, last
        while next_post < posts:
            index = next_post
            next_post += 1
            which = index % len(apis)
            ids = await apis[which].post(type_, body)
            if len(ids) != lines:
                raise BenchError(f"a {lines}-line POST got {len(ids)} ids")
            latest[which] = _later(latest[which], ids[-1])
            last = time.monotonic()

    async with asyncio.TaskGroup() as group:
        for _ in range(min(conns, posts)):
            group.create_task(worker())
    return last, [i for i in latest if i]


async def measure_throughput(
    urls: Sequence[str],
    token: str,
    client: str,
    *,
    lang: str,
    jobs: int,
    warm: int,
    conns: int,
    poll: float,
    limit_s: float,
    daemon_pids: Sequence[int],
    postmaster: int | None,
    profile: Callable[[], None] | None = None,
    stats_every: float = 1.0,
    progress: bool = True,
) -> Throughput:
    """See the module docstring; ``profile`` is called just before the first POST.

    ``/stats`` counts every job of the tenant (a scan: ~0.1 s at 100k jobs), so
    polling it every ``poll`` seconds would load PostgreSQL more than the jobs
    do. It is asked every ``stats_every`` seconds for the timeline; meanwhile
    the last job each daemon acknowledged is looked up by id every ``poll``
    seconds (a primary-key read), and once those are done ``/stats`` is polled
    (every ``poll`` seconds, or less often when it is slow) until ``done_ok`` has
    grown by ``jobs``.
    """
    type_ = f"noop_{lang}"
    if jobs % POST_LINES:
        raise BenchError(f"jobs must be a multiple of {POST_LINES}")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        apis = [Api(session, url, token, client) for url in urls]
        await apis[0].add_handler(type_, lang, NOOP[lang])
        base = await apis[0].stats(type_)
        # warm-up: every daemon gets work, in small posts so several contexts start
        warm_body = bulk_body(WARM_POST_LINES)
        warm_posts = max(len(apis), -(-warm // WARM_POST_LINES))
        await _post_all(apis, type_, warm_body, warm_posts, conns)
        warm_target = base["done_ok"] + warm_posts * WARM_POST_LINES
        base = await _wait_done(apis[0], type_, warm_target, base, 120.0, poll)
        await asyncio.sleep(0.5)  # let every daemon go idle
        base = await apis[0].stats(type_)
        poller = apis[-1]  # (three daemons: not the one posts start with)
        poller.stats_seconds.clear()

        body = bulk_body(POST_LINES)
        target = base["done_ok"] + jobs
        if profile is not None:
            profile()
        cpu0 = Cpu.sample(daemon_pids, postmaster)
        t0 = time.monotonic()
        poster = asyncio.create_task(_post_all(apis, type_, body, jobs // POST_LINES, conns))
        stored: float | None = None
        last_ids: list[str] | None = None
        last_done = False
        timeline: list[tuple[float, dict[str, int]]] = []
        next_stats = stats_every
        next_check = 0.0
        try:
            while True:
                now = time.monotonic() - t0
                if poster.done():
                    if last_ids is None:
                        last_ids = (await poster)[1]
                    if not last_done:
                        found = [await poller.job(i) for i in last_ids]
                        if stored is None and all(job is not None for job in found):
                            stored = now
                        last_done = all(j is not None and j["state"] == "done" for j in found)
                if (last_done and now >= next_check) or now >= next_stats:
                    counts = await poller.stats(type_)
                    # never more than a third of the time in /stats (its scan loads PostgreSQL)
                    next_check = time.monotonic() - t0 + 2 * poller.stats_seconds[-1]
                    timeline.append((now, counts))
                    if _bad(counts, base):
                        raise BenchError(f"jobs of {type_} failed: {counts}")
                    if counts["done_ok"] >= target:
                        break
                    if now >= next_stats:
                        next_stats += stats_every
                        if progress:
                            print(
                                f"    {now:5.1f} s: waiting {counts['waiting']:>7,} "
                                f"running {counts['running']:>4} "
                                f"done {counts['done_ok'] - base['done_ok']:>7,}",
                                flush=True,
                            )
                if now > limit_s:
                    raise BenchError(
                        f"{type_}: not done after {limit_s:.0f} s: "
                        f"{timeline[-1][1] if timeline else 'no /stats yet'}"
                    )
                await asyncio.sleep(poll)
            elapsed = time.monotonic() - t0
            cpu1 = Cpu.sample(daemon_pids, postmaster)
            posted = (await poster)[0] - t0
        finally:
            if not poster.done():
                poster.cancel()
                await asyncio.gather(poster, return_exceptions=True)
        stats_times = poller.stats_seconds
        return Throughput(
            lang=lang,
            daemons=len(urls),
            jobs=jobs,
            seconds=elapsed,
            posted=posted,
            stored=stored,
            cores=cpu1.cores_since(cpu0),
            stats_ms=1000 * statistics.fmean(stats_times) if stats_times else 0.0,
            polls=len(stats_times),
            timeline=timeline,
        )


@dataclass(slots=True)
class Latency:
    starts_ms: list[float]  # POST sent → handler started
    acks_ms: list[float]  # POST sent → 200 received (journaled)
    seen_ms: list[float]  # POST sent → the bench saw it done (polling)

    @staticmethod
    def pct(values: Sequence[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure_latency(
    url: str, token: str, client: str, *, samples: int, warm: int, poll: float = 0.002
) -> Latency:
    type_ = "clock"
    async with aiohttp.ClientSession() as session:
        api = Api(session, url, token, client)
        await api.add_handler(type_, "python", PY_CLOCK)
        return await sample_latency(api, type_, samples=samples, warm=warm, poll=poll)


async def sample_latency(
    api: Api, type_: str, *, samples: int, warm: int, pause: float = 0.05, poll: float = 0.002
) -> Latency:
    """Post one job of ``type_`` (a ``PY_CLOCK`` handler) at a time and wait for it
    to be done, ``pause`` seconds apart; the first ``warm`` are not counted."""
    result = Latency([], [], [])
    for i in range(warm + samples):
        sent = time.time()
        (job_id,) = await api.post(type_, b'{"latency": 1}\n')
        acked = time.time()
        deadline = time.monotonic() + 60
        while True:
            job = await api.job(job_id)
            if job is not None and job.get("state") == "done":
                break
            if time.monotonic() > deadline:
                raise BenchError(f"latency job {job_id} not done within 60 s: {job}")
            await asyncio.sleep(poll)
        seen = time.time()
        if job.get("code") != "ok":
            raise BenchError(f"latency job {job_id} ended {job.get('code')}: {job}")
        started = float(job["result"])
        if i >= warm:
            result.starts_ms.append(1000 * (started - sent))
            result.acks_ms.append(1000 * (acked - sent))
            result.seen_ms.append(1000 * (seen - sent))
        await asyncio.sleep(pause)  # idle between samples
    return result


def postmaster_pid(pgdata: Path | None) -> int | None:
    """The private PostgreSQL's postmaster, whose children are the backends."""
    if pgdata is None:
        return None
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None

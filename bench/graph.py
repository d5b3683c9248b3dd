"""Job graphs (docs/api.md "Job graphs"): how long dependencies take to resolve.

Every graph hangs from a gate: a job of a pulled type that the bench claims
first and completes when the graph is built, so the clock starts at one
known moment. No-op python jobs make the graph.

- fan-out: 10,000 jobs after the gate; gate done → all 10,000 done;
- fan-in: 10,000 leaves after the gate, 100 collectors after 100 leaves each,
  one final job after the 100 collectors; gate done → final done;
- chain: N jobs each after the one before (the first after the gate);
  gate done → last done, and each link's release latency (the dependency's
  run ended → the dependent's run started, from their ``runs``);
- cascade: the same chain's length under a gate that fails: every job ends
  424 in the store's one resolution; gate done → last done.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

if TYPE_CHECKING:
    from bench.cli import Run

NOOP = "def handler(payload, ctx):\n    return None\n"
GATE = "bench_gate"
STEP = "bench_step"
POLL_S = 0.01


class Graph:
    def __init__(self, session: aiohttp.ClientSession, url: str, client: str) -> None:
        self.session = session
        self.url = f"{url}/{client}"

    async def call(self, method: str, path: str, body: Any = None, **params: str) -> Any:
        data = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
        headers = {"Content-Type": "text/plain" if isinstance(body, bytes) else "application/json"}
        async with self.session.request(
            method, self.url + path, data=data, params=params or None, headers=headers
        ) as reply:
            raw = await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"{method} {path}: {reply.status} {raw[:300]!r}")
            return orjson.loads(raw)

    async def add(self, jobtype: str, count: int, **params: str) -> list[str]:
        body = b"\n".join(b"x" for _ in range(count))
        ids: list[str] = (await self.call("POST", f"/job/{jobtype}/add", body, **params))["ids"]
        return ids

    async def gate(self) -> tuple[str, dict[str, Any]]:
        """A new gate job, claimed by the bench: (id, its claim)."""
        [gate_id] = await self.add(GATE, 1)
        while True:
            claimed = await self.call("POST", f"/job/{GATE}/claim", {"worker": "bench", "wait": 5})
            if claimed["jobs"]:
                job: dict[str, Any] = claimed["jobs"][0]
                return gate_id, job

    async def open_gate(self, job: dict[str, Any], exitcode: int = 200) -> float:
        body = {"worker": "bench", "claim": job["claim"], "exitcode": exitcode}
        await self.call("POST", f"/job/{job['id']}/complete", body)
        return time.perf_counter()

    async def done(self, job_id: str) -> dict[str, Any]:
        while True:
            job: dict[str, Any] = await self.call("GET", f"/job/{job_id}", wait="30")
            if job["state"] == "done":
                return job

    async def done_count(self) -> int:
        stats = await self.call("GET", "/stats")
        counts = stats["types"].get(STEP, {})
        return int(counts.get("done_ok", 0)) + int(counts.get("done_failed", 0))

    async def until_done(self, count: int) -> None:
        """Until ``count`` jobs of the graph's type are done (``/stats`` is read
        at most every 0.1 s: the figure may be up to that much late)."""
        while True:
            if await self.done_count() >= count:
                return
            await asyncio.sleep(POLL_S)


async def _prepare(graph: Graph) -> None:
    await graph.call("POST", f"/handler/add/{GATE}", {"lang": "worker", "timeout": 3600})
    await graph.call("POST", f"/handler/add/{STEP}", {"lang": "python", "body": NOOP})
    # a warm context before the clock starts
    [warm] = await graph.add(STEP, 1)
    await graph.done(warm)


async def fan_out(graph: Graph, count: int) -> float:
    gate_id, gate = await graph.gate()
    for start in range(0, count, 1000):
        await graph.add(STEP, min(1000, count - start), after=gate_id)
    target = await graph.done_count() + count
    began = await graph.open_gate(gate)
    await graph.until_done(target)
    return time.perf_counter() - began


async def fan_in(graph: Graph, leaves: int, per: int = 100) -> float:
    gate_id, gate = await graph.gate()
    leaf_ids: list[str] = []
    for start in range(0, leaves, 1000):
        leaf_ids += await graph.add(STEP, min(1000, leaves - start), after=gate_id)
    collectors = [
        (await graph.add(STEP, 1, after=",".join(leaf_ids[i : i + per])))[0]
        for i in range(0, leaves, per)
    ]
    [final] = await graph.add(STEP, 1, after=",".join(collectors[:per]))
    began = await graph.open_gate(gate)
    await graph.done(final)
    return time.perf_counter() - began


async def chain(graph: Graph, length: int, *, fail: bool) -> tuple[float, list[str]]:
    gate_id, gate = await graph.gate()
    ids = [gate_id]
    for _ in range(length):
        ids += await graph.add(STEP, 1, after=ids[-1])
    began = await graph.open_gate(gate, 400 if fail else 200)
    await graph.done(ids[-1])
    return time.perf_counter() - began, ids[1:]


def _ms(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000


async def release_latency(graph: Graph, ids: list[str], samples: int) -> list[float]:
    """Milliseconds from a link's run end to the next link's run start."""
    step = max(1, len(ids) // samples)
    gaps = []
    for i in range(0, len(ids) - 1, step):
        first = await graph.call("GET", f"/job/{ids[i]}")
        second = await graph.call("GET", f"/job/{ids[i + 1]}")
        gaps.append(_ms(second["runs"][0]["started"]) - _ms(first["runs"][-1]["ended"]))
    return gaps


async def measure_graphs(
    url: str, token: str, client: str, *, size: int, chain_length: int, samples: int
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        graph = Graph(session, url, client)
        await _prepare(graph)
        out: dict[str, Any] = {"fan_out_s": await fan_out(graph, size)}
        out["fan_in_s"] = await fan_in(graph, size)
        out["chain_s"], ids = await chain(graph, chain_length, fail=False)
        out["release_ms"] = await release_latency(graph, ids, samples)
        out["cascade_s"], _ = await chain(graph, chain_length, fail=True)
        return out


def run(url: str, token: str, client: str, **kw: Any) -> dict[str, Any]:
    return asyncio.run(measure_graphs(url, token, client, **kw))


def section_graph(run_: Run) -> None:
    from bench import daemon
    from bench.e2e import Latency
    from bench.report import Row
    from bench.runs import daemons

    quick = run_.opts.quick
    size, length = (1000, 200) if quick else (10_000, 10_000)
    with daemons(run_, "graph", 1) as (_, urls, token):
        got = run(urls[0], token, daemon.TENANT, size=size, chain_length=length, samples=200)
    gaps = got["release_ms"]
    rows = run_.rows
    rows.append(
        Row(
            f"(graph) fan-out, 1 → {size:,} jobs",
            got["fan_out_s"],
            "s",
            notes=(
                f"gate done → all {size:,} dependents done (no-op python),"
                f" {size / got['fan_out_s']:,.0f} jobs/s"
            ),
        )
    )
    rows.append(
        Row(
            f"(graph) fan-in, {size:,} → {size // 100} → 1",
            got["fan_in_s"],
            "s",
            notes=("gate done → the final job done (leaves, collectors of 100, final)"),
        )
    )
    rows.append(
        Row(
            f"(graph) chain of {length:,}",
            got["chain_s"],
            "s",
            notes=(f"gate done → last done, {got['chain_s'] / length * 1000:.2f} ms a link"),
        )
    )
    rows.append(
        Row(
            f"(graph) failing chain of {length:,} (424 cascade)",
            got["cascade_s"] * 1000,
            "ms",
            notes="gate fails → every link ended 424 (the gate's complete returns once the"
            " store resolved them all: one statement)",
        )
    )
    rows.append(
        Row(
            "(graph) dependency release, p50",
            Latency.pct(gaps, 0.5),
            "ms",
            notes="a link's run ended → the next link's run started (runs are kept in ms)",
        )
    )
    rows.append(
        Row(
            "(graph) dependency release, p99",
            Latency.pct(gaps, 0.99),
            "ms",
            notes=f"{len(gaps)} links sampled; max {max(gaps):.1f} ms",
        )
    )

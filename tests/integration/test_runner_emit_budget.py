"""A batch's follow-on budget (runners/PROTOCOL.md, ``emit_batch``): python and
node contexts keep ``ctx.emit`` payloads while the batch's budget lasts, in the
order of its jobs, and count what they drop for it (``emit_short``) apart from
what is over a run's own limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.pool import RunnerPool, RunnerSettings

pytestmark = pytest.mark.timeout(60)
JOB = 65536  # what a follow-on job costs the budget beyond its payload

BODIES = {
    "python": (
        "def handler(p, ctx):\n"
        "    for size in p.split():\n"
        "        ctx.emit('kid', 'x' * int(size))\n"
    ),
    "node": (
        "module.exports = (p, ctx) => {\n"
        "  for (const size of p.split(' ')) ctx.emit('kid', 'x'.repeat(Number(size)));\n"
        "};\n"
    ),
}


class Sink:
    """Tells contexts a run's limit and the batch's budget; keeps results as they are."""

    def __init__(self, limit: int, budget: int | None) -> None:
        self.limit = limit
        self.budget = budget

    def emit_limit(self) -> int:
        return self.limit

    def emit_budget(self) -> int | None:
        return self.budget

    def wants(self, result: JobResult) -> bool:
        return False

    def progress(self, job_id: str, fraction: object, message: object) -> None:
        pass

    async def take(self, result: JobResult) -> JobResult:
        return result


@pytest.fixture
async def pool(work_root: Path) -> AsyncIterator[RunnerPool]:
    pool = RunnerPool(RunnerSettings(work_root=work_root))
    yield pool
    await pool.close()


@pytest.mark.parametrize("lang", ["python", "node"])
async def test_the_batch_budget_is_spent_in_order_and_short_drops_are_told_apart(
    pool: RunnerPool, lang: str
) -> None:
    spec = HandlerSpec(version=f"v-{lang}", client="acme", type="t", lang=lang, body=BODIES[lang])
    payloads = ["40 40", "40", "10 500", "5"]
    jobs = [JobInput(id=f"j{i}", payload=p, attempt=1) for i, p in enumerate(payloads)]
    budget = 3 * JOB + 100  # each payload costs its bytes and a job's 64 KiB
    results = await pool.run_batch(spec, jobs, Sink(limit=200, budget=budget))
    got = [(len(r.emits), r.emit_over, r.emit_short) for r in results]
    # two kept (20 bytes and a job left short of 40 + a job: short); 10 fits (10
    # left), 500 is over the run's own limit (over, not short); 5 is short
    assert got == [(2, 0, 0), (0, 1, 1), (1, 1, 0), (0, 1, 1)], got
    assert [r.emit_cost for r in results] == [0, 40 + JOB, 0, 5 + JOB]
    # a job short of the budget gives back what it took: the next job has it
    jobs = [JobInput(id="a", payload="40 40", attempt=1), JobInput(id="b", payload="10", attempt=1)]
    results = await pool.run_batch(spec, jobs, Sink(limit=200, budget=(40 + JOB) + (10 + JOB)))
    assert [(len(r.emits), r.emit_over, r.emit_short) for r in results] == [(1, 1, 1), (1, 0, 0)]
    unbounded = await pool.run_batch(spec, jobs, Sink(limit=200, budget=None))
    assert [(len(r.emits), r.emit_over, r.emit_short) for r in unbounded] == [(2, 0, 0), (1, 0, 0)]

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
    results = await pool.run_batch(spec, jobs, Sink(limit=200, budget=100))
    got = [(len(r.emits), r.emit_over, r.emit_short) for r in results]
    # 80 of 100 spent; 40 is over the 20 left (short); 10 fits, 500 is over the
    # run's own limit (over, not short); then 5 of the 10 left
    assert got == [(2, 0, 0), (0, 1, 1), (1, 1, 0), (1, 0, 0)], got
    unbounded = await pool.run_batch(spec, jobs, Sink(limit=200, budget=None))
    assert [(len(r.emits), r.emit_over, r.emit_short) for r in unbounded] == [
        (2, 0, 0),
        (1, 0, 0),
        (1, 1, 0),
        (1, 0, 0),
    ]

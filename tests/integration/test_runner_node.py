"""Node contexts through the runner pool: the daemon side of the node bootstrap."""

from __future__ import annotations

import time

from queue_daemon.runners.models import HandlerSpec
from queue_daemon.runners.pool import RunnerPool
from tests.integration.test_runner_python import jobs, pool

__all__ = ["pool"]  # a fixture


def node(body: str, **kw: object) -> HandlerSpec:
    return HandlerSpec(
        version="v1",
        client="acme",
        type="n",
        lang="node",
        body=body,
        **kw,  # type: ignore[arg-type]
    )


async def test_process_exit_inside_a_batch_ends_at_once_and_the_next_batch_runs(
    pool: RunnerPool,
) -> None:
    spec = node(
        "module.exports = (p) => { if (p === 'exit') process.exit(3); return 'ok ' + p }",
        timeout=20,
    )
    began = time.monotonic()
    results = await pool.run_batch(spec, jobs("a", "exit", "b"))
    # the context's death is seen at once, not at the 20 s job timeout
    assert time.monotonic() - began < 10
    assert [(r.exitcode, r.ran) for r in results] == [(200, True), (500, True), (100, False)]
    assert "exit status 3" in str(results[1].result)
    (again,) = await pool.run_batch(spec, jobs("c"))
    assert (again.exitcode, again.result) == (200, "ok c")


async def test_node_handler_shapes_and_output(pool: RunnerPool) -> None:
    spec = node(
        "module.exports = async (p, ctx) => {\n"
        "  console.log('J: next|' + p); ctx.emit('audit', {p});\n"
        "  if (p === 'fail') throw new Error('boom');\n"
        "  return [201, p.toUpperCase()];\n"
        "}\n"
    )
    ok, bad = await pool.run_batch(spec, jobs("x", "fail"))
    assert (ok.exitcode, ok.result) == (201, "X")
    assert ("next", "x") in ok.emits and ("audit", '{"p":"x"}') in ok.emits
    assert bad.exitcode == 500 and "boom" in str(bad.result)

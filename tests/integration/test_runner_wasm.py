"""Wasm handlers through the runner pool: the module's stdin, stdout, stderr and
exit, its time and memory bounded, nothing reached beyond its own memory."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import wasmtime

from harness import wat
from harness.api import until
from queue_daemon.runners.check import check_handler
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.pool import RunnerPool, RunnerSettings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def pool(work_root: Path, tmp_path: Path) -> AsyncIterator[RunnerPool]:
    pool = RunnerPool(
        RunnerSettings(work_root=work_root, wasm_memory=8 << 20, wasm_cache=tmp_path / "cache")
    )
    yield pool
    await pool.close()


def spec(body: str, *, timeout: float = 5.0, memory: int = 0) -> HandlerSpec:
    """A handler version per body, as the store gives one per handler add."""
    return HandlerSpec(
        version="h" + hashlib.sha256(f"{body} {timeout} {memory}".encode()).hexdigest()[:16],
        client="acme",
        type="w",
        lang="wasm",
        body=body,
        timeout=timeout,
        memory=memory,
    )


async def run(pool: RunnerPool, body: str, *payloads: str, **kw: object) -> list[JobResult]:
    jobs = [JobInput(id=f"j{i}", payload=p, attempt=1) for i, p in enumerate(payloads or ["x"])]
    return await pool.run_batch(spec(body, **kw), jobs)  # type: ignore[arg-type]


async def test_the_payload_is_stdin_and_stdout_the_output(pool: RunnerPool) -> None:
    [one, two] = await run(pool, wat.echo(), "héllo", "J: next|p1\nS: 201 fine\nsaid")
    assert (one.exitcode, one.result, list(one.log)) == (200, None, ["héllo"])
    assert (two.exitcode, two.result, list(two.emits)) == (201, "fine", [("next", "p1")])
    assert list(two.log) == ["said"]


async def test_the_module_may_be_the_binary_in_base64(pool: RunnerPool) -> None:
    binary = base64.b64encode(wasmtime.wat2wasm(wat.prints("S: 200 from binary\n"))).decode()
    [result] = await run(pool, binary)
    assert (result.exitcode, result.result) == (200, "from binary")


@pytest.mark.parametrize(
    ("code", "exitcode", "result"),
    [
        (0, 200, None),
        (110, 110, None),
        (1, 500, "exit status 1"),
        (99, 500, "exit status 99"),
        (404, 500, "trap: proc_exit with a status above 125 (an S: line sets any code)"),
    ],
)
async def test_exit_statuses(
    pool: RunnerPool, code: int, exitcode: int, result: str | None
) -> None:
    [r] = await run(pool, wat.prints("", exit=code))
    assert (r.exitcode, r.result) == (exitcode, result)


async def test_stderr_is_the_log_and_a_trap_an_error(pool: RunnerPool) -> None:
    [said] = await run(pool, wat.prints("oops\n", fd=2))
    assert said.exitcode == 200 and list(said.log) == ["stderr: oops"]
    [trapped] = await run(pool, wat.traps())
    assert trapped.exitcode == 500 and trapped.result is not None
    assert trapped.result.startswith("trap: ") and "unreachable" in trapped.result


async def test_a_module_that_loops_ends_at_its_timeout(pool: RunnerPool) -> None:
    began = time.monotonic()
    [looped, after] = await run(pool, wat.spins(), "a", "b", timeout=0.3)
    took = time.monotonic() - began
    assert (looped.exitcode, looped.result) == (504, "timed out after 0.3s")
    assert after.exitcode == 504
    assert 0.5 <= took < 3.0


async def test_memory_grows_only_to_the_cap(pool: RunnerPool) -> None:
    [small] = await run(pool, wat.grows(16))  # 1 MiB more
    assert small.result == "grown"
    [big] = await run(pool, wat.grows(200))  # 12.5 MiB: over the daemon's 8
    assert big.result == "refused"
    [handler] = await run(pool, wat.grows(16), memory=1 << 20)  # the handler's lower cap
    assert handler.result == "refused"
    [raised] = await run(pool, wat.grows(150), memory=1 << 40)  # never above the daemon's
    assert raised.result == "refused"


async def test_no_files_no_sockets_no_environment(pool: RunnerPool) -> None:
    badf = "errno 08"  # WASI's EBADF: there is no fd 3, no directory, no socket
    for module in (wat.opens("etc/passwd"), wat.opens("../../etc/passwd"), wat.accepts()):
        [r] = await run(pool, module)
        assert (r.exitcode, r.result) == (200, badf)
    [env] = await run(pool, wat.counts_environ())
    assert env.result == "env 00"


async def test_a_stdout_flood_is_cut_and_ends_at_the_timeout(pool: RunnerPool) -> None:
    [r] = await run(pool, wat.floods(size=60_000), timeout=1.0)
    assert r.exitcode == 504
    assert any("bytes dropped" in line for line in r.log)
    [e] = await run(pool, wat.floods(fd=2), timeout=0.5)
    assert e.exitcode == 504 and len(e.log) <= 21
    [small] = await run(pool, wat.floods(), timeout=0.5)
    assert small.exitcode == 504


async def test_a_module_is_compiled_once_then_read_from_disk(
    work_root: Path, tmp_path: Path
) -> None:
    settings = RunnerSettings(work_root=work_root, wasm_cache=tmp_path / "cache")
    body = wat.prints("S: 200 cached\n")
    for _ in range(2):
        pool = RunnerPool(settings)
        try:
            [r] = await run(pool, body)
            [again] = await run(pool, body)
            assert r.result == again.result == "cached"
            compiles = pool._wasm.modules.compiles
            # a new version of the same module: no compile, not even from the disk
            [other] = await pool.run_batch(
                dataclasses.replace(spec(body), version="another"),
                [JobInput(id="o", payload="x", attempt=1)],
            )
            assert other.result == "cached"
            assert pool._wasm.modules.compiles == compiles
        finally:
            await pool.close()
    assert compiles == 0  # the second pool read what the first compiled
    assert len(list((tmp_path / "cache").glob("*.cwasm"))) == 1


async def test_a_batch_runs_on_warm_modules_in_microseconds(pool: RunnerPool) -> None:
    await run(pool, wat.noop())
    results = await run(pool, wat.noop(), *["p"] * 500)
    assert all(r.exitcode == 200 for r in results)
    times = sorted(r.run_ms or 0.0 for r in results)
    assert times[len(times) // 2] < 5.0  # ms: no compile per job


async def test_a_timeout_leaves_the_context_warm(pool: RunnerPool) -> None:
    body = wat.spins()
    [first] = await run(pool, body, timeout=0.5)
    pids = {c.pid for c in pool.contexts()}
    [second] = await run(pool, body, timeout=0.5)
    assert first.exitcode == second.exitcode == 504
    assert {c.pid for c in pool.contexts()} == pids  # the module trapped; its context stays


async def test_close_ends_runs_in_progress(work_root: Path) -> None:
    import asyncio

    pool = RunnerPool(RunnerSettings(work_root=work_root))
    task = asyncio.create_task(run(pool, wat.spins(), timeout=600))

    async def running() -> bool | None:
        return any(c.alive for c in pool.contexts()) or None

    await until(running, 10, "the module running")
    began = time.monotonic()
    await pool.close()
    [r] = await asyncio.wait_for(task, 10)
    assert r.exitcode != 200 and time.monotonic() - began < 5


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("(module", "not a module in the text format"),
        ("AGFzbQ==", "does not compile"),  # the magic alone, no version
        ('(module (func (export "main")))', "no _start"),
        ('(module (import "env" "f" (func)) (func (export "_start")))', "imports env.f"),
        ("   ", "empty"),
    ],
)
def test_a_bad_module_is_refused_at_add(body: str, problem: str) -> None:
    message = check_handler("wasm", body)
    assert message is not None and problem in message
    assert check_handler("wasm", wat.echo()) is None

"""Cold start of a python and a node context, in-process through
``queue_daemon.runners.pool.RunnerPool``; and of a wasm module (compile +
instantiate + run, against a warm run of the cached module).

Each round registers a new handler version (so the pool must start a context:
spawn → bootstrap → load the handler → ``ready``), times the first one-job
``run_batch`` of it, then a second one on the now warm context; the cold
start is the difference. The reference is the bare interpreter: ``python -I
-c pass`` and ``node -e 0``, spawn to exit, timed in the same run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import BenchError
from bench.report import Row

BODIES = {
    "python": "def handler(p, ctx):\n    return None\n",
    "node": "module.exports = (payload, ctx) => {};\n",
}
CLIENT = "bench"
FALLBACK_MEMORY = 4 << 30  # RLIMIT_AS tried when a context cannot start under the default


@dataclass(frozen=True, slots=True)
class ColdStart:
    lang: str
    cold_ms: list[float]  # first run_batch minus warm run_batch, per round
    warm_ms: list[float]
    bare_ms: list[float]  # the interpreter alone, spawn → exit
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.cold_ms)

    @property
    def bare(self) -> float:
        return statistics.median(self.bare_ms)


def _bare_argv(lang: str) -> list[str]:
    if lang == "python":
        return [sys.executable, "-I", "-c", "pass"]
    from queue_daemon.runners.node import node_command

    return [*node_command(), "-e", "0"]


def _bare(lang: str, rounds: int) -> list[float]:
    argv = _bare_argv(lang)
    subprocess.run(argv, check=True, timeout=60)  # the disk cache, once
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, timeout=60)
        times.append(1000 * (time.perf_counter() - t0))
    return times


async def _cold(
    work: Path, lang: str, rounds: int, memory_bytes: int | None = None
) -> tuple[list[float], list[float]]:
    from queue_daemon.runners.models import HandlerSpec, JobInput
    from queue_daemon.runners.pool import RunnerPool, RunnerSettings

    settings = RunnerSettings(work_root=work, context_idle=600.0)
    if memory_bytes is not None:
        settings = dataclasses.replace(settings, memory_bytes=memory_bytes)
    pool = RunnerPool(settings)
    type_ = f"cold_{lang}"
    cold: list[float] = []
    warm: list[float] = []
    try:
        for i in range(rounds + 1):  # round 0 warms the disk cache and the sandbox
            spec = HandlerSpec(
                version=f"v{i}", client=CLIENT, type=type_, lang=lang, body=BODIES[lang]
            )
            times = []
            for attempt in range(2):
                job = JobInput(id=f"{lang}-{i}-{attempt}", payload='{"cold": 1}', attempt=1)
                t0 = time.perf_counter()
                (result,) = await pool.run_batch(spec, [job])
                times.append(1000 * (time.perf_counter() - t0))
                if result.exitcode != 200:
                    raise BenchError(
                        f"{lang} cold-start job ended {result.exitcode}: {result.result}"
                    )
            if i > 0:
                cold.append(times[0] - times[1])
                warm.append(times[1])
            pool.retire(CLIENT, type_)  # closes the idle context before the next version
            await asyncio.sleep(0.05)
    finally:
        await pool.close()
    return cold, warm


def measure(
    work: Path, langs: tuple[str, ...] = ("python", "node"), rounds: int = 5
) -> list[ColdStart]:
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for lang in langs:
        note = ""
        try:
            cold, warm = asyncio.run(_cold(work, lang, rounds))
        except BenchError as exc:
            # e.g. node under the default RLIMIT_AS: measured again with room, and said so
            reason = str(exc).split("\n", 1)[0].split(": 1", 1)[0][:120]
            cold, warm = asyncio.run(_cold(work, lang, rounds, memory_bytes=FALLBACK_MEMORY))
            note = (
                f"FAILS with the runner's default limits ({reason}); "
                f"measured with RLIMIT_AS {FALLBACK_MEMORY >> 30} GiB"
            )
        out.append(ColdStart(lang, cold, warm, _bare(lang, rounds), note))
    return out


@dataclass(frozen=True, slots=True)
class WasmColdStart:
    name: str
    size: int  # bytes of the module's binary
    compiled_ms: list[float]  # a context of a module never seen: compile, spawn, load
    cached_ms: list[float]  # a context of a module compiled before: spawn, load
    warm_ms: list[float]  # a 1-job batch in the warm context

    @property
    def median(self) -> float:
        return statistics.median(self.compiled_ms)

    @property
    def cached(self) -> float:
        return statistics.median(self.cached_ms)

    def row(self) -> Row:
        return Row(
            f"(coldstart) wasm {self.name}, compile + context ready",
            self.median,
            "ms",
            "module cached",
            self.median / self.cached,
            f"median of {len(self.compiled_ms)}, {self.size:,} bytes of module; a context"
            f" of a module compiled before {self.cached:.0f} ms; warm 1-job batch"
            f" {self.warm:.1f} ms",
        )

    @property
    def warm(self) -> float:
        return statistics.median(self.warm_ms)


def _wasm_module(salt: int, functions: int) -> str:
    """A no-op command with ``functions`` more small functions; ``salt`` makes each
    round's module new to the cache."""
    body = "".join(
        f"(func (param i32) (result i32) (i32.add (local.get 0) (i32.const {salt + i})))"
        for i in range(functions)
    )
    return f'(module (memory (export "memory") 1) {body} (func (export "_start")))'


async def _wasm_cold(work: Path, rounds: int, functions: int) -> WasmColdStart:
    import wasmtime

    from queue_daemon.runners.models import HandlerSpec, JobInput
    from queue_daemon.runners.pool import RunnerPool, RunnerSettings

    pool = RunnerPool(RunnerSettings(work_root=work, context_idle=600.0))
    compiled: list[float] = []
    cached: list[float] = []
    warm: list[float] = []
    size = 0
    type_ = f"cold_wasm_{functions}"
    try:
        for i in range(rounds + 1):  # round 0 warms the disk cache and the sandbox
            body = _wasm_module(i * 100_000, functions)
            size = len(wasmtime.wat2wasm(body))
            times = []
            for version, attempts in ((f"w{i}", 2), (f"w{i}-again", 1)):
                spec = HandlerSpec(
                    version=version, client=CLIENT, type=type_, lang="wasm", body=body
                )
                for attempt in range(attempts):
                    job = JobInput(id=f"{version}-{attempt}", payload="x", attempt=1)
                    t0 = time.perf_counter()
                    (result,) = await pool.run_batch(spec, [job])
                    times.append(1000 * (time.perf_counter() - t0))
                    if result.exitcode != 200:
                        raise BenchError(
                            f"wasm cold-start job ended {result.exitcode}: {result.result}"
                        )
                pool.retire(CLIENT, type_)
                await asyncio.sleep(0.05)
            if i > 0:
                compiled.append(times[0] - times[1])
                warm.append(times[1])
                cached.append(times[2] - times[1])
    finally:
        await pool.close()
    name = "no-op" if not functions else f"{functions:,} functions"
    return WasmColdStart(name, size, compiled, cached, warm)


def measure_wasm(work: Path, rounds: int = 5) -> list[WasmColdStart]:
    work.mkdir(parents=True, exist_ok=True)
    return [asyncio.run(_wasm_cold(work, rounds, n)) for n in (0, 5000)]

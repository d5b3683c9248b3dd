"""Wasm handlers: each job runs a WASI preview-1 module with wasmtime, in the
daemon's own process, in a thread of a small pool.

WebAssembly is its own wall: a module reaches nothing but its linear memory
and the WASI calls it is given, and it is given no directory, no network, no
environment and no arguments, only its stdin (the job's payload), stdout (its
result and output lines) and stderr (its log). So wasm jobs run the same as
root or not, for every tenant, with no namespace or uid. Its time is bounded
by epoch interruption (a tick every ``TICK`` seconds; past the handler's
timeout the module traps: 504), its memory by the store's limit (``memory.grow``
fails past it), its output by ``MAX_STDOUT`` (the rest counted and dropped).
The threads run at a lower priority (nice ``NICE``) than the daemon's own.

A job's store and instance are new (a few microseconds); its compiled module
is not (``runners.modules.CompiledModules``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import wasmtime
from wasmtime import _ffi

from queue_daemon.runners.codes import ERROR, OK, TIMEOUT
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.modules import (
    MEMORY_CACHE,
    CompiledModules,
    ModuleError,
    digest,
    engine_config,
    module_bytes,
)
from queue_daemon.runners.output import OutputLimits, parse_output
from queue_daemon.runners.ring import LineRing

TICK = 0.01  # seconds between epoch ticks: a timeout is kept to about this
NICE = 10  # the wasm threads' niceness
STDERR_LINES = 20  # last lines of a job's stderr kept as log lines
MAX_STDOUT = 16 << 20  # bytes of a job's stdout parsed; the rest is counted and dropped
CHUNK = 64  # jobs of a batch a thread runs in one go
# Each write of a module to stdout or stderr is a call into Python (holding the
# GIL the daemon's event loop needs): past WRITE_BURST writes in a run, each
# one waits WRITE_PAUSE seconds, so a flood of small writes costs the daemon
# about a thousand calls a second, not hundreds of thousands.
WRITE_BURST = 10_000
WRITE_PAUSE = 0.001
# wasmtime's C call that takes stdin as bytes (not in its Python API)
_stdin_bytes = getattr(_ffi, "wasi_config_set_stdin_bytes", None)
# the blob of a handler's "module": (client, address) -> its bytes, None if gone
BlobReader = Callable[[str, str], Awaitable[bytes | None]]


class WasmRunner:
    """Runs the jobs of wasm handlers, ``concurrency`` at a time across batches."""

    def __init__(
        self,
        limits: OutputLimits,
        *,
        memory: int,
        concurrency: int = 2,
        cache_dir: Path | None = None,
        blobs: BlobReader | None = None,
    ) -> None:
        self._limits = limits
        self._memory = memory
        self._blobs = blobs
        self._engine = wasmtime.Engine(engine_config())
        self.modules = CompiledModules(self._engine, cache_dir)
        self._keys: dict[str, str] = {}  # handler version -> its module's key
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="wasm", initializer=_lower_priority
        )
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._longest = 0  # the most ticks any run was given: what closing increments

    async def run_batch(self, spec: HandlerSpec, jobs: Sequence[JobInput]) -> list[JobResult]:
        try:
            key, binary = await self._source(spec)
        except ModuleError as exc:
            return [JobResult(id=job.id, exitcode=ERROR, result=str(exc)) for job in jobs]
        self._start_ticker()
        loop = asyncio.get_running_loop()
        chunks = [jobs[i : i + CHUNK] for i in range(0, len(jobs), CHUNK)]
        done = await asyncio.gather(
            *(
                loop.run_in_executor(self._pool, self._run_chunk, spec, key, binary, chunk)
                for chunk in chunks
            )
        )
        return [result for chunk in done for result in chunk]

    async def _source(self, spec: HandlerSpec) -> tuple[str, bytes | None]:
        """The module's cache key, and its binary unless it is compiled already."""
        key = self._keys.get(spec.version)
        if key is not None and self.modules.cached(key) is not None:
            return key, None  # a handler version's module never changes
        key, binary = await self._read(spec)
        self._keys[spec.version] = key
        while len(self._keys) > 4 * MEMORY_CACHE:
            del self._keys[next(iter(self._keys))]
        return key, binary

    async def _read(self, spec: HandlerSpec) -> tuple[str, bytes | None]:
        if spec.module:
            key = spec.module.removeprefix("sha256:")
            if self.modules.cached(key) is not None:
                return key, None
            data = None if self._blobs is None else await self._blobs(spec.client, spec.module)
            if data is None:
                raise ModuleError(f"the module's blob {spec.module} is gone")
            return key, await asyncio.to_thread(module_bytes, data)
        binary = await asyncio.to_thread(module_bytes, spec.body)
        return digest(binary), binary

    def _run_chunk(
        self, spec: HandlerSpec, key: str, binary: bytes | None, jobs: Sequence[JobInput]
    ) -> list[JobResult]:
        try:
            module = self.modules.get(key, binary)
        except ModuleError as exc:
            return [JobResult(id=job.id, exitcode=ERROR, result=str(exc)) for job in jobs]
        linker = self._linker()
        return [self._run_job(spec, module, linker, job) for job in jobs]

    def _linker(self) -> wasmtime.Linker:
        linker: wasmtime.Linker | None = getattr(self._local, "linker", None)
        if linker is None:
            linker = wasmtime.Linker(self._engine)
            linker.define_wasi()
            self._local.linker = linker
        return linker

    def _run_job(
        self, spec: HandlerSpec, module: wasmtime.Module, linker: wasmtime.Linker, job: JobInput
    ) -> JobResult:
        if self._stop.is_set():
            return JobResult(id=job.id, exitcode=ERROR, result="not started: the daemon stops")
        started = time.perf_counter()
        output = _Output()
        store = wasmtime.Store(self._engine)
        memory = min(self._memory, spec.memory) if spec.memory else self._memory
        store.set_limits(memory_size=memory, instances=1, tables=4, memories=1)
        ticks = math.ceil(spec.timeout / TICK) + 1
        self._longest = max(self._longest, ticks)
        store.set_epoch_deadline(ticks)
        stdin = -1
        try:
            config = wasmtime.WasiConfig()
            stdin = _give_stdin(config, job.payload.encode("utf-8", "surrogatepass"))
            config.stdout_custom = output.stdout
            config.stderr_custom = output.stderr
            config.argv = (spec.type,)
            store.set_wasi(config)
            status: int | str = 0
            try:
                instance = linker.instantiate(store, module)
                start = instance.exports(store)["_start"]
                assert isinstance(start, wasmtime.Func)
                start(store)
            except wasmtime.ExitTrap as exc:
                status = exc.code
            except wasmtime.Trap as exc:
                code = exc.trap_code
                if code == wasmtime.TrapCode.INTERRUPT:
                    status = "timeout"
                else:
                    status = code.name.lower().replace("_", " ") if code else str(exc)
            except wasmtime.WasmtimeError as exc:
                status = str(exc)
                if "invalid exit status" in status:  # WASI's proc_exit takes 0..125
                    status = "proc_exit with a status above 125 (an S: line sets any code)"
        finally:
            if stdin >= 0:
                os.close(stdin)
            with contextlib.suppress(Exception):
                store.close()
        run_ms = (time.perf_counter() - started) * 1000
        return self._result(spec, job, status, output, run_ms)

    def _result(
        self, spec: HandlerSpec, job: JobInput, status: int | str, output: _Output, run_ms: float
    ) -> JobResult:
        output.stderr_lines.close()
        errors = [f"stderr: {line}" for line in output.stderr_lines.lines()]
        stdout = bytes(output.out)
        if output.dropped:
            errors.append(f"stdout over {MAX_STDOUT} bytes: {output.dropped} bytes dropped")
            stdout = stdout[: stdout.rfind(b"\n") + 1]  # no cut J: or S: line counts
        parsed = parse_output(stdout.decode("utf-8", "replace"), self._limits, extra_log=errors)
        timed_out = status == "timeout"
        result: str | None = None
        if timed_out:
            exitcode, result = TIMEOUT, f"timed out after {spec.timeout:g}s"
        elif status == 0:
            exitcode = OK
        elif isinstance(status, int) and 100 <= status <= 599:
            exitcode = status
        elif isinstance(status, int):
            exitcode, result = ERROR, f"exit status {status}"
        else:
            exitcode, result = ERROR, f"trap: {_first_line(status)}"
        if parsed.exitcode is not None and not timed_out:
            exitcode = parsed.exitcode
            if parsed.result_set:
                result = parsed.result
        return JobResult(
            id=job.id,
            exitcode=exitcode,
            result=result,
            emits=parsed.emits,
            log=parsed.log,
            dropped=parsed.dropped,
            run_ms=run_ms,
        )

    def _start_ticker(self) -> None:
        if self._ticker is None and not self._stop.is_set():
            self._ticker = threading.Thread(target=self._tick, name="wasm-epoch", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            self._engine.increment_epoch()
        # closing: every run still going ends at its next check
        for _ in range(self._longest + 1):
            self._engine.increment_epoch()

    async def close(self) -> None:
        """Runs in progress trap; their jobs end with 504 or 500."""
        self._stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            await asyncio.to_thread(ticker.join)
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)


class _Output:
    """A job's stdout (up to MAX_STDOUT) and the last lines of its stderr."""

    __slots__ = ("dropped", "out", "stderr_lines", "writes")

    def __init__(self) -> None:
        self.out = bytearray()
        self.dropped = 0
        self.stderr_lines = LineRing(STDERR_LINES)
        self.writes = 0

    def stdout(self, data: bytes) -> None:
        self._count()
        room = MAX_STDOUT - len(self.out)
        self.out.extend(data[:room])
        self.dropped += max(0, len(data) - room)

    def stderr(self, data: bytes) -> None:
        self._count()
        self.stderr_lines.feed(data)

    def _count(self) -> None:
        self.writes += 1
        if self.writes > WRITE_BURST:
            time.sleep(WRITE_PAUSE)


def _give_stdin(config: wasmtime.WasiConfig, data: bytes) -> int:
    """Make ``data`` the module's stdin: handed over as bytes where wasmtime's C API
    takes them (tens of microseconds less), else through a memfd; the memfd's
    descriptor to close after the run, or -1."""
    if _stdin_bytes is not None:
        vec = _ffi.wasm_byte_vec_t()
        _ffi.wasm_byte_vec_new(
            ctypes.byref(vec),
            len(data),
            ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8)),
        )
        _stdin_bytes(config.ptr(), ctypes.byref(vec))  # the config owns the vector now
        return -1
    fd = os.memfd_create("payload", os.MFD_CLOEXEC)
    os.write(fd, data)
    config.stdin_file = f"/proc/self/fd/{fd}"
    return fd


def _first_line(text: str) -> str:
    """What wasmtime's message says the cause is (past its backtrace), in a line."""
    text = text.partition("Caused by:")[2] or text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:500] if lines else "unknown"


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)

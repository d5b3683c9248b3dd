"""The python handler a wasm handler's context runs (``runners.wasm``): the daemon
sends this source as the handler's body, after a line that sets ``QD_WASM``:
``module`` (the compiled module, serialized by the daemon's wasmtime, base64),
``reserve`` (the engine's memory reservation, as the daemon compiled it),
``memory`` (bytes of linear memory at most), ``timeout`` (seconds), ``name``
(the module's only argument) and ``wasmtime`` (the directory wasmtime is
imported from).

Each job runs a new instance: its payload on stdin, its stdout printed (the
context reads it as output lines), the last lines of its stderr printed as
``stderr: …`` log lines. A normal return or ``proc_exit(0)`` is 200,
``proc_exit(n)`` with 100 <= n <= 125 is n, another status or a trap 500, a
module still running near its timeout traps (504) and the context stays.
"""

import base64
import sys
import threading
import time

_SET = globals().pop("QD_WASM")
MEMORY: int = _SET["memory"]
TIMEOUT: float = _SET["timeout"]
NAME: str = _SET["name"]
if _SET["wasmtime"] not in sys.path:
    sys.path.append(_SET["wasmtime"])

import wasmtime  # noqa: E402
from wasmtime import _ffi  # noqa: E402

STDOUT_LIMIT = 16 << 20  # bytes of a job's stdout kept; the rest counted and dropped
STDERR_LINES = 20
LINE_LIMIT = 1000  # bytes kept of one stderr line
TABLE_ELEMENTS = 100_000  # elements of a module's tables, at most (8 bytes each)


def _engine() -> "wasmtime.Engine":
    config = wasmtime.Config()
    config.epoch_interruption = True
    config.memory_reservation = _SET["reserve"]
    config.memory_guard_size = 64 << 10
    config.memory_reservation_for_growth = 0
    return wasmtime.Engine(config)


_ENGINE = _engine()
_MODULE = wasmtime.Module.deserialize(_ENGINE, base64.b64decode(_SET.pop("module")))
_LINKER = wasmtime.Linker(_ENGINE)
_LINKER.define_wasi()
# a run traps this long after it started: before the daemon's own clock ends the context
_LIMIT = max(TIMEOUT * 0.9, TIMEOUT - 1.0)
_STDIN_BYTES = getattr(_ffi, "wasi_config_set_stdin_bytes", None)


# The watcher ends a run at its time: one epoch increment, and every store's
# deadline is one increment away. It sleeps until the time of the run it saw,
# so back-to-back runs wake it about once per timeout, and an idle context
# never: no tick per 10 ms in every context.
_LOCK = threading.Condition()
_RUN: list[float | None] = [None]  # the end of the run now
_WATCHING = [False]


def _watch() -> None:
    with _LOCK:
        while True:
            run = _RUN[0]
            if run is None:
                _WATCHING[0] = False
                _LOCK.wait()
                continue
            left = run - time.monotonic()
            if left > 0:
                _LOCK.wait(left)
                continue
            _ENGINE.increment_epoch()  # under the lock: no other run has begun meanwhile
            _RUN[0] = None


def _begin() -> None:
    with _LOCK:
        _RUN[0] = time.monotonic() + _LIMIT
        if not _WATCHING[0]:
            _WATCHING[0] = True
            _LOCK.notify()


def _end() -> None:
    with _LOCK:
        _RUN[0] = None


threading.Thread(target=_watch, name="wasm-watch", daemon=True).start()


class _Output:
    def __init__(self) -> None:
        self.out = bytearray()
        self.dropped = 0
        self.err = b""
        self.lines: list[bytes] = []

    def stdout(self, data: bytes) -> None:
        room = STDOUT_LIMIT - len(self.out)
        self.out += data[:room]
        self.dropped += max(0, len(data) - room)

    def stderr(self, data: bytes) -> None:
        *complete, rest = (self.err + data[-(STDERR_LINES + 1) * LINE_LIMIT * 4 :]).split(b"\n")
        kept = [line[:LINE_LIMIT] for line in complete[-STDERR_LINES:]]
        self.lines = (self.lines + kept)[-STDERR_LINES:]
        self.err = rest[:LINE_LIMIT]


def _stdin(config: "wasmtime.WasiConfig", data: bytes) -> None:
    if _STDIN_BYTES is not None:
        import ctypes

        vec = _ffi.wasm_byte_vec_t()
        pointer = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        _ffi.wasm_byte_vec_new(ctypes.byref(vec), len(data), pointer)
        _STDIN_BYTES(config.ptr(), ctypes.byref(vec))  # the config owns the vector now
        return
    import os
    import tempfile

    with tempfile.NamedTemporaryFile(delete=False) as file:
        file.write(data)
    config.stdin_file = file.name
    os.unlink(file.name)  # wasmtime opened it already


def _cause(text: str) -> str:
    text = text.partition("Caused by:")[2] or text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:500] if lines else "unknown"


def handler(payload: str, ctx: object) -> int | tuple[int, str]:
    output = _Output()
    store = wasmtime.Store(_ENGINE)
    store.set_limits(
        memory_size=MEMORY, table_elements=TABLE_ELEMENTS, instances=1, tables=4, memories=1
    )
    store.set_epoch_deadline(1)
    status: int | str = 0
    _begin()
    try:
        config = wasmtime.WasiConfig()
        _stdin(config, payload.encode("utf-8", "surrogatepass"))
        config.stdout_custom = output.stdout
        config.stderr_custom = output.stderr
        config.argv = (NAME,)
        store.set_wasi(config)
        try:
            instance = _LINKER.instantiate(store, _MODULE)
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
                status = code.name.lower().replace("_", " ") if code else _cause(str(exc))
        except wasmtime.WasmtimeError as exc:
            status = _cause(str(exc))
            if "invalid exit status" in status:  # WASI's proc_exit takes 0..125
                status = "proc_exit with a status above 125 (an S: line sets any code)"
    finally:
        _end()
        store.close()
    out = bytes(output.out)
    if output.dropped:
        out = out[: out.rfind(b"\n") + 1]  # no cut J: or S: line counts
    sys.stdout.write(out.decode("utf-8", "replace"))
    if out and not out.endswith(b"\n"):
        sys.stdout.write("\n")
    if output.err:
        output.lines.append(output.err)
    for line in output.lines[-STDERR_LINES:]:
        sys.stdout.write("stderr: " + line.decode("utf-8", "replace") + "\n")
    if output.dropped:
        sys.stdout.write(f"stdout over {STDOUT_LIMIT} bytes: {output.dropped} bytes dropped\n")
    if status == "timeout":
        return 504, f"timed out after {TIMEOUT:g}s"
    if status == 0:
        return 200
    if isinstance(status, int) and 100 <= status <= 599:
        return status
    if isinstance(status, int):
        return 500, f"exit status {status}"
    return 500, f"trap: {status}"

"""WebAssembly modules of wasm handlers: reading one (the text format, or the binary
in base64, or a blob's bytes), checking it at handler add, and compiling it once.

A module is a WASI preview-1 command: it may import only from
``wasi_snapshot_preview1`` and exports a ``_start`` function. Compiled modules
are kept serialized on disk (the daemon's cache directory, named by the
module's digest, wasmtime's version and the memory reservation) and the most
recent ``MEMORY_CACHE`` in memory, so a daemon compiles a module once, not at
every context's start.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import threading
from collections import OrderedDict
from importlib.metadata import version
from pathlib import Path

import wasmtime

from queue_daemon.runners.errors import ModuleError

WASI = "wasi_snapshot_preview1"
MAGIC = b"\0asm"
MEMORY_CACHE = 16  # serialized modules kept in memory, at most
MEMORY_BYTES = 128 << 20  # and at most this many bytes of them


def engine_config(memory: int = 256 << 20) -> wasmtime.Config:
    """An engine's settings, the same where a module is compiled and where it runs
    (``bootstrap/wasm_shim.py``): timeouts interrupt a module at an epoch tick;
    linear memory is reserved up to ``memory`` bytes (a context's address space is
    limited), with a small guard, so the code checks its bounds itself."""
    config = wasmtime.Config()
    config.epoch_interruption = True
    config.memory_reservation = memory
    config.memory_guard_size = 64 << 10
    config.memory_reservation_for_growth = 0
    return config


def module_bytes(source: str | bytes) -> bytes:
    """The binary of a module given as text (the text format, or the binary in
    base64) or as a blob's bytes (the binary, or the text format in UTF-8)."""
    if isinstance(source, bytes):
        if source.startswith(MAGIC):
            return source
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError:
            raise ModuleError("the blob is neither a WebAssembly binary nor UTF-8 text") from None
    text = source.strip()
    if not text:
        raise ModuleError("the module is empty")
    if not text.startswith("("):
        try:
            binary = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            binary = b""
        if binary.startswith(MAGIC):
            return binary
    try:
        return bytes(wasmtime.wat2wasm(text))
    except wasmtime.WasmtimeError as exc:
        raise ModuleError(
            f"not a module in the text format nor a binary in base64: {first_line(exc)}"
        ) from None


def digest(binary: bytes) -> str:
    return hashlib.sha256(binary).hexdigest()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def command_problem(module: wasmtime.Module) -> str | None:
    """Why ``module`` is not a WASI preview-1 command, or None."""
    for item in module.imports:
        if item.module != WASI:
            return f"it imports {item.module}.{item.name}: only {WASI} is there"
    start = next((e for e in module.exports if e.name == "_start"), None)
    if start is None or not isinstance(start.type, wasmtime.FuncType):
        return "it exports no _start function (a WASI command's entry point)"
    return None


_check_engine: wasmtime.Engine | None = None


def check_module(source: str | bytes) -> str | None:
    """None if ``source`` is a WASI command that compiles, else why not.
    Compiles: call it through ``asyncio.to_thread``."""
    global _check_engine
    try:
        binary = module_bytes(source)
    except ModuleError as exc:
        return str(exc)
    if _check_engine is None:
        _check_engine = wasmtime.Engine(engine_config())
    try:
        module = wasmtime.Module(_check_engine, binary)
    except wasmtime.WasmtimeError as exc:
        return f"the module does not compile: {first_line(exc)}"
    return command_problem(module)


class CompiledModules:
    """Modules compiled by the daemon's engine, serialized, by digest: on disk
    (``directory``, when given) and the last few in memory; compiled when
    neither has one. The contexts deserialize what this gives them."""

    def __init__(self, memory: int, directory: Path | None) -> None:
        self._engine = wasmtime.Engine(engine_config(memory))
        self._directory = directory
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._tag = digest(f"{version('wasmtime')} {memory}".encode())[:12]
        self.compiles = 0  # modules compiled here (not read from memory or disk)

    def has(self, key: str) -> bool:
        with self._lock:
            if key in self._memory:
                return True
        path = self._path(key)
        return path is not None and path.exists()

    def artifact(self, key: str, binary: bytes | None) -> bytes:
        """The serialized module of digest ``key``: from memory, the disk, or
        compiled from ``binary`` (ModuleError when there is none, or it fails)."""
        with self._lock:
            data = self._memory.get(key)
            if data is not None:
                self._memory.move_to_end(key)
                return data
        data = self._read(key)
        if data is None:
            if binary is None:
                raise ModuleError("the module is not cached here and its bytes are gone")
            try:
                module = wasmtime.Module(self._engine, binary)
            except wasmtime.WasmtimeError as exc:
                raise ModuleError(f"the module does not compile: {first_line(exc)}") from None
            problem = command_problem(module)
            if problem is not None:
                raise ModuleError(f"not a WASI command: {problem}")
            data = bytes(module.serialize())
            self.compiles += 1
            self._write(key, data)
        with self._lock:
            self._memory[key] = data
            while len(self._memory) > 1 and (
                len(self._memory) > MEMORY_CACHE
                or sum(map(len, self._memory.values())) > MEMORY_BYTES
            ):
                self._memory.popitem(last=False)
        return data

    def _path(self, key: str) -> Path | None:
        if self._directory is None:
            return None
        return self._directory / f"{key}-{self._tag}.cwasm"

    def _read(self, key: str) -> bytes | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            # only files the daemons of this data directory wrote (its mode 0700)
            return path.read_bytes()
        except OSError:
            return None

    def _write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            part = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.part")
            part.write_bytes(data)
            os.replace(part, path)  # whole or not at all, for another daemon reading it
        except OSError:
            pass  # no disk cache: the module is compiled again at the next start

"""Wasm handlers: a WASI preview-1 module run with wasmtime in a warm context of
its own, a python process behind the same walls as every handler's.

The daemon compiles a module once (``runners.modules.CompiledModules``, kept
on disk), and a context of the handler gets it serialized, with the handler
``runners/bootstrap/wasm_shim.py`` as its python body: each job runs a new
instance of the module there (its payload on stdin, its stdout the output
lines, its stderr logged). So wasm jobs run on every core, in batches, as
python jobs do, and the daemon's own process never runs a module.

WebAssembly is its own wall: the module reaches nothing but its linear memory
and the WASI calls it is given, and it is given no directory, no network, no
environment and no argument but its type's name. Its time is bounded by
epoch interruption (it traps before its timeout, and the context stays), its
memory by the store's limit (``memory.grow`` fails past it). Where no walls
stand between tenants (not root, no bubblewrap), wasm handlers still run for
every tenant: their contexts run no tenant code but the module.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from queue_daemon.runners.errors import ModuleError
from queue_daemon.runners.models import HandlerSpec

if TYPE_CHECKING:  # wasmtime is imported at the first wasm batch, not with the daemon
    from queue_daemon.runners.modules import CompiledModules

SHIM = Path(__file__).parent / "bootstrap" / "wasm_shim.py"
BODIES = 32  # handler versions whose context body is kept in memory, at most
BODY_BYTES = 256 << 20  # and at most this many bytes of them
MAX_ARTIFACT = 32 << 20  # bytes of a compiled module: in base64 it fits one frame
# the blob of a handler's "module": (client, address) -> its bytes, None if gone
BlobReader = Callable[[str, str], Awaitable[bytes | None]]


class WasmModules:
    """The context body of each wasm handler version: its module compiled once."""

    def __init__(
        self, *, memory: int, cache_dir: Path | None = None, blobs: BlobReader | None = None
    ) -> None:
        self.memory = memory  # the engine reserves this much: a module's most
        self._blobs = blobs
        self._cache_dir = cache_dir
        self._modules: CompiledModules | None = None
        self._bodies: OrderedDict[str, str] = OrderedDict()  # handler version -> body

    @property
    def modules(self) -> CompiledModules:
        if self._modules is None:
            from queue_daemon.runners.modules import CompiledModules

            self._modules = CompiledModules(self.memory, self._cache_dir)
        return self._modules

    async def context_spec(self, spec: HandlerSpec) -> HandlerSpec:
        """``spec`` as its context runs it: the shim with the compiled module as its
        body. ModuleError when the module cannot be had (a blob gone) or compiled."""
        body = self._bodies.get(spec.version)
        if body is None:
            key, binary = await self._read(spec)
            artifact = await asyncio.to_thread(self.modules.artifact, key, binary)
            if len(artifact) > MAX_ARTIFACT:
                raise ModuleError(
                    f"the compiled module is {len(artifact):,} bytes, over the"
                    f" {MAX_ARTIFACT:,} a context takes"
                )
            memory = min(spec.memory, self.memory) if spec.memory else self.memory
            settings = {
                "module": base64.b64encode(artifact).decode(),
                "reserve": self.memory,
                "memory": memory,
                "timeout": spec.timeout,
                "name": spec.type,
                "wasmtime": _wasmtime_dir(),
            }
            body = f"QD_WASM = {settings!r}\n{_shim()}"
            self._bodies[spec.version] = body
            while len(self._bodies) > BODIES or (
                len(self._bodies) > 1 and sum(map(len, self._bodies.values())) > BODY_BYTES
            ):
                self._bodies.popitem(last=False)
        else:
            self._bodies.move_to_end(spec.version)
        return dataclasses.replace(spec, body=body, module="")

    async def _read(self, spec: HandlerSpec) -> tuple[str, bytes | None]:
        """The module's cache key (its digest), and its binary unless cached."""
        from queue_daemon.runners.modules import digest, module_bytes

        if spec.module:
            key = spec.module.removeprefix("sha256:")
            if self.modules.has(key):
                return key, None
            data = None if self._blobs is None else await self._blobs(spec.client, spec.module)
            if data is None:
                raise ModuleError(f"the module's blob {spec.module} is gone")
            return key, await asyncio.to_thread(module_bytes, data)
        binary = await asyncio.to_thread(module_bytes, spec.body)
        return digest(binary), binary


@cache
def _shim() -> str:
    return SHIM.read_text()


@cache
def _wasmtime_dir() -> str:
    """Where wasmtime is imported from: the contexts import it from there too."""
    import wasmtime

    return os.path.dirname(os.path.dirname(os.path.abspath(wasmtime.__file__)))

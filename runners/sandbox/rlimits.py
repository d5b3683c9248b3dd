"""The resource limits of every handler process, and the wrapper that sets them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessLimits:
    """Resource limits of every handler process (setrlimit, soft = hard)."""

    memory_bytes: int = 1 << 30  # RLIMIT_AS (node: RLIMIT_DATA, see Sandbox.spawn)
    cpu_seconds: int = 3600  # RLIMIT_CPU, over the life of a context
    open_files: int = 256  # RLIMIT_NOFILE
    processes: int = 64  # RLIMIT_NPROC: counts every process and thread of the uid
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE
    tmp_size: int = 64 << 20  # bytes of the private /dev/shm (and /tmp) of each process tree


def limits_argv(
    limits: ProcessLimits, *, memory: str, prlimit: str | None, python: str, script: str
) -> list[str]:
    """The wrapper that applies ``limits``; ``memory`` "as" (address space) or "data".
    util-linux ``prlimit`` at ``prlimit``, else ``bootstrap/limits.py`` (``script``)
    run by ``python``."""
    values = {
        memory: limits.memory_bytes,
        "cpu": limits.cpu_seconds,
        "nofile": limits.open_files,
        "nproc": limits.processes,
        "fsize": limits.file_bytes,
        "core": 0,
    }
    if prlimit:
        return [prlimit, *(f"--{name}={value}" for name, value in values.items()), "--"]
    pairs = (f"{name}={value}" for name, value in values.items())
    return [python, "-I", "-S", script, *pairs, "--"]

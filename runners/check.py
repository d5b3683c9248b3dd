"""Checking a handler when it is added, without running it."""

from __future__ import annotations

from queue_daemon.runners.http import url_problem
from queue_daemon.runners.models import LANGS

TOP_LEVEL_AWAIT = 0x2000  # ast.PyCF_ALLOW_TOP_LEVEL_AWAIT: hooks may use await


def check_handler(
    lang: str, body: str, *, before: str = "", before_each: str = "", after_each: str = ""
) -> str | None:
    """None if the handler can be stored, else the compiler's message.

    Blocking (node spawns ``node --check``): call it through ``asyncio.to_thread``.
    """
    hooks = {"before": before, "beforeEach": before_each, "afterEach": after_each}
    if lang == "python":
        problem = _python(body, "body", 0)
        for name, source in hooks.items():
            problem = problem or (_python(source, name, TOP_LEVEL_AWAIT) if source else None)
        return problem
    if lang == "node":
        from queue_daemon.runners.node import check_node

        problem = check_node(body)
        if problem is not None:
            return problem
        for name, source in hooks.items():
            problem = check_node(source, hook=True) if source.strip() else None
            if problem is not None:
                return f"{name}: {problem}"
        return None
    if lang == "shell":
        if not body.strip():
            return "the body must be a shell command"
        if "\x00" in body:
            return "the command contains a NUL byte"
        return None
    if lang == "http":
        return url_problem(body)
    if lang == "wasm":
        from queue_daemon.runners.modules import check_module

        return check_module(body)
    return f"unknown lang {lang[:40]!r}: one of {', '.join(LANGS)}"


def _python(source: str, part: str, flags: int) -> str | None:
    prefix = "" if part == "body" else f"{part}: "
    try:
        compile(source, f"<{part}>", "exec", flags=flags, dont_inherit=True)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno else ""
        return f"{prefix}{where}{exc.msg}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"{prefix}{type(exc).__name__}: {exc}"
    return None

"""Python context bootstrap: runs one tenant handler, speaking runners/PROTOCOL.md.

fd 3: frames from the daemon; fd 4: frames to the daemon (4-byte big-endian
length + UTF-8 JSON; ``python_frames.py``). Standalone and stdlib only: it
runs as ``python -I`` in the sandboxed child and never imports the project. Start-up time matters
(a cold context waits for it), so asyncio, traceback and linecache are imported
only when first needed.
"""

from __future__ import annotations

import builtins
import io
import os
import sys
import time

# the bootstrap's own modules, from its directory (``-I`` leaves it off sys.path);
# off the path again before any handler runs
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_ctx import Ctx
from python_frames import HELD, IN_FD, OUT_FD, Reader, frame, result_frame, to_json, write

del sys.path[0]

TYPE_CHECKING = False  # typing is not imported at run time: start-up time
if TYPE_CHECKING:
    from collections.abc import Awaitable
    from types import CodeType
    from typing import Any

    Message = dict[str, Any]

MAX_TEXT = 16 << 20  # characters of a job's output or result carried in one frame
TOP_LEVEL_AWAIT = 0x2000  # ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, without importing ast

_real_stdout = sys.stdout
_loop: Any = None
monotonic = time.monotonic


def event_loop() -> Any:
    """One persistent loop for every coroutine the handler returns."""
    global _loop
    if _loop is None:
        import asyncio

        _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)
    return _loop


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def resolve(value: Any) -> Any:
    if hasattr(value, "__await__") and not isinstance(value, (str, bytes)):
        return event_loop().run_until_complete(_awaited(value))
    return value


def remember_source(name: str, source: str) -> None:
    """Let tracebacks show the tenant's lines."""
    import linecache

    linecache.cache[name] = (len(source), None, source.splitlines(True), name)


def run_hook(code: CodeType, namespace: dict[str, Any]) -> None:
    resolve(eval(code, namespace))  # a hook that awaits at its top level is a coroutine


def compile_part(part: str, source: str) -> CodeType | None:
    """The code of the ``body`` (always), or of a hook (None when it is empty; a
    hook may ``await`` at its top level)."""
    if part != "body" and not source.strip():
        return None
    name, flags = ("<handler>", 0) if part == "body" else (f"<{part}>", TOP_LEVEL_AWAIT)
    remember_source(name, source)
    code: CodeType = compile(source, name, "exec", flags=flags, dont_inherit=True)
    return code


def compile_message(part: str, exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        where = f"line {exc.lineno}: " if exc.lineno else ""
        message = f"{where}{exc.msg}"
    else:
        message = f"{type(exc).__name__}: {exc}"
    return message if part == "body" else f"{part}: {message}"


def describe(exc: BaseException) -> str:
    """The last line(s) of the traceback: the exception's type and message."""
    import traceback

    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def log_traceback(exc: BaseException, out: io.TextIOWrapper) -> None:
    import traceback

    try:
        out.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except Exception:  # a broken stdout must not stop the job
        return


def shape(value: Any) -> tuple[Any, str | None]:
    """(exitcode, result) of a handler's return value, per PROTOCOL.md."""
    if value is None:
        return 200, None
    if isinstance(value, bool):
        return 200, to_json(value)
    if isinstance(value, int):
        return value, None
    if isinstance(value, str):
        return 200, value
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and isinstance(value[0], int)
        and not isinstance(value[0], bool)
    ):
        code, result = value
        if result is None or isinstance(result, str):
            return code, result
        return code, to_json(result)
    return 200, to_json(value)


class BoundedBuffer(io.BytesIO):
    """A job's captured stdout: keeps the first ``KEEP`` bytes and counts
    the rest, so a handler that prints without end costs no memory (it runs
    on until its timeout, and its output says how much was dropped)."""

    KEEP = MAX_TEXT - 1024  # room for the note in one frame's text

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def write(self, data: Any) -> int:
        size = len(data)
        room = self.KEEP - self.tell()
        if size <= room:
            return super().write(data)
        if room > 0:
            super().write(bytes(data[:room]))
        self.dropped += size - max(room, 0)
        return size

    def take(self) -> str:
        """What was printed (and a note of what was dropped); then empty."""
        text = self.getvalue().decode("utf-8", "replace") if self.tell() else ""
        if self.dropped:
            text += f"\n[output over {self.KEEP} bytes: {self.dropped} bytes dropped]"
        self.seek(0)
        self.truncate()
        self.dropped = 0
        return text


# What the handlers of one eid share in their context (each has its own globals):
# the name ``shared`` in each handler's globals is this one dict.
SHARED: dict[str, Any] = {}


class Handler:
    def __init__(self, init: Message) -> None:
        self.type = init.get("type", "")
        self.client = init.get("client", "")
        self.namespace: dict[str, Any] = {
            "__name__": "handler",
            "__builtins__": builtins,
            "shared": SHARED,
        }
        self.before_each: CodeType | None = None
        self.after_each: CodeType | None = None
        self.function: Any = None
        self._capture: tuple[BoundedBuffer, io.TextIOWrapper] | None = None
        self.pace = 0.001  # seconds a job takes, a moving average (Held.QUICK)

    def load(self, init: Message) -> str | None:
        """None when the handler is ready, else the ``fatal`` message."""
        parts: dict[str, CodeType | None] = {}
        for part in ("body", "before", "beforeEach", "afterEach"):
            try:
                parts[part] = compile_part(part, init.get(part) or "")
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
                return compile_message(part, exc)
        for part in ("body", "before"):  # the body's code is never a coroutine's
            code = parts[part]
            try:
                if code is not None:
                    run_hook(code, self.namespace)
            except BaseException as exc:
                return f"{part} failed: {describe(exc)}"
        function = self.namespace.get("handler")
        if not callable(function):
            return "the body does not define handler(payload, ctx)"
        self.function = function
        self.before_each = parts["beforeEach"]
        self.after_each = parts["afterEach"]
        return None

    def capture(self) -> tuple[BoundedBuffer, io.TextIOWrapper]:
        """The stdout a job prints to: reused while the handler leaves it intact."""
        pair = self._capture
        if pair is None or pair[1].closed or pair[0].closed or pair[0].tell() or pair[0].dropped:
            data = BoundedBuffer()
            text = io.TextIOWrapper(data, encoding="utf-8", errors="replace", write_through=True)
            pair = self._capture = (data, text)
        return pair

    def run_job(
        self, job: Message, emit_limit: int | None = None, budget: list[int] | None = None
    ) -> Message:
        """The job's ``result`` message (with the output the handler printed)."""
        ctx = Ctx(job, self.type, self.client, emit_limit, budget)
        capture, out = self.capture()
        message: Message = {"op": "result", "id": job["id"]}
        sys.stdout = out
        try:
            value = resolve(self.function(job["payload"], ctx))
            code, result = shape(value)
        except BaseException as exc:
            code, result = 500, describe(exc)
            log_traceback(exc, out)
            if isinstance(exc, MemoryError):
                message["recycle"] = True
        finally:
            sys.stdout = _real_stdout
        try:
            out.flush()
        except Exception:  # the handler closed or broke its stdout
            output = ""
        else:
            output = capture.take()
        message["exitcode"] = code
        message["result"] = None if result is None else result[:MAX_TEXT]
        message["output"] = output[:MAX_TEXT]
        message["emits"] = ctx._pairs
        if ctx._progress is not None:
            message["progress"] = ctx._progress
        if ctx._over:
            message["emit_over"] = ctx._over
            if ctx._short:
                message["emit_short"] = ctx._short
                message["emit_cost"] = ctx._cost
        return message

    def run_batch(
        self, jobs: list[Message], emit_limit: int | None = None, budget: int | None = None
    ) -> None:
        shared = None if budget is None else [budget]  # what the batch's jobs may emit together
        failed = None
        if self.before_each is not None:
            try:
                run_hook(self.before_each, self.namespace)
            except BaseException as exc:
                failed = f"beforeEach failed: {describe(exc)}"
        pending = b""
        held = HELD
        ended = 0.0
        for job in jobs:
            # the result of the job before tells the daemon that this one starts:
            # only the batch's first job has a start frame of its own
            if not pending:
                write(frame({"op": "start", "id": job["id"]}))
            elif self.pace < held.QUICK and held.map is not None:
                held.add(pending, ended)
            else:
                held.flush(pending)
            began = monotonic()
            if failed is None:
                message = self.run_job(job, emit_limit, shared)
            else:
                message = {"op": "result", "id": job["id"], "exitcode": 500, "result": failed}
            ended = monotonic()
            took = ended - began
            pending = result_frame(message, took * 1000)
            self.pace += (took - self.pace) / 4
        if self.after_each is not None and failed is None:
            try:
                run_hook(self.after_each, self.namespace)
            except BaseException as exc:
                sys.stderr.write(f"afterEach failed: {describe(exc)}\n")
        HELD.flush(pending + frame({"op": "done"}))


def main() -> None:
    os.set_inheritable(IN_FD, False)
    os.set_inheritable(OUT_FD, False)
    reader = Reader(IN_FD)
    init = reader.frame()
    if init is None or init.get("op") != "init":
        return
    # a context of an eid loads one handler per type of it (another ``init``)
    handlers: dict[str, Handler] = {}
    while init is not None:
        handler = Handler(init)
        problem = handler.load(init)
        if problem is not None:
            write(frame({"op": "fatal", "message": problem}))
            return
        handlers[handler.type] = handler
        write(frame({"op": "ready"}))
        init = serve(reader, handlers)


def serve(reader: Reader, handlers: dict[str, Handler]) -> Message | None:
    """Run batches until the input ends or asks to exit (None), or another
    handler is to be loaded (its ``init`` message)."""
    first = next(iter(handlers.values()))
    while True:
        message: Message | None = reader.frame()
        if message is None:
            return None
        op = message.get("op")
        if op == "batch":
            limit = message.get("emit")
            budget = message.get("emit_batch")
            handler = handlers.get(str(message.get("type", "")), first)
            handler.run_batch(
                message.get("jobs") or [],
                limit if type(limit) is int else None,
                budget if type(budget) is int else None,
            )
        elif op == "init":
            return message
        elif op == "exit":
            return None
        else:
            sys.stderr.write(f"python_boot: unknown op {op!r} ignored\n")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: a context's exit must be quick
